/* amrtree--0.1.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION amrtree" to load this file. \quit

CREATE FUNCTION amrtree_handler(internal)
RETURNS index_am_handler
AS 'MODULE_PATHNAME'
LANGUAGE C STRICT;

CREATE ACCESS METHOD amrtree TYPE INDEX HANDLER amrtree_handler;
COMMENT ON ACCESS METHOD amrtree IS 'AMR-Tree: R-tree with DRAM inner nodes and PMEM/SSD leaves';

-- Same strategy numbers and operators as GiST's box_ops, so that
-- USING gist -> USING amrtree changes no query.
CREATE OPERATOR CLASS box_ops
DEFAULT FOR TYPE box USING amrtree AS
	OPERATOR	1	<<  (box, box),
	OPERATOR	2	&<  (box, box),
	OPERATOR	3	&&  (box, box),
	OPERATOR	4	&>  (box, box),
	OPERATOR	5	>>  (box, box),
	OPERATOR	6	~=  (box, box),
	OPERATOR	7	@>  (box, box),
	OPERATOR	8	<@  (box, box),
	OPERATOR	9	&<| (box, box),
	OPERATOR	10	<<| (box, box),
	OPERATOR	11	|>> (box, box),
	OPERATOR	12	|&> (box, box);

CREATE FUNCTION amrtree_check(index regclass)
RETURNS boolean
AS 'MODULE_PATHNAME'
LANGUAGE C STRICT VOLATILE PARALLEL RESTRICTED;
COMMENT ON FUNCTION amrtree_check(regclass) IS
'verify an amrtree index: raises an ERROR naming the first broken invariant, returns true otherwise';

CREATE FUNCTION amrtree_index_stats(index regclass,
	OUT height integer,
	OUT inner_nodes bigint,
	OUT leaves bigint,
	OUT entries bigint,
	OUT dram_bytes bigint,
	OUT pmem_bytes bigint,
	OUT ssd_bytes bigint)
RETURNS record
AS 'MODULE_PATHNAME'
LANGUAGE C STRICT VOLATILE PARALLEL RESTRICTED;
COMMENT ON FUNCTION amrtree_index_stats(regclass) IS
'shape and size of an amrtree index per tier';

CREATE FUNCTION amrtree_leaf_entries(index regclass,
	OUT leaf_id bigint,
	OUT entry integer,
	OUT tid tid,
	OUT key box,
	OUT insert_lsn pg_lsn,
	OUT dead boolean)
RETURNS SETOF record
AS 'MODULE_PATHNAME'
LANGUAGE C STRICT VOLATILE PARALLEL RESTRICTED;
COMMENT ON FUNCTION amrtree_leaf_entries(regclass) IS
'every entry of an amrtree index (for diagnosis; reads the whole index)';

CREATE FUNCTION amrtree_settle(index regclass, settle_seconds float8 DEFAULT 5)
RETURNS bigint
AS 'MODULE_PATHNAME'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION amrtree_settle(regclass, float8) IS
'run the tier manager on an index now, wait settle_seconds, and again until no move is pending; returns the moves made';

CREATE FUNCTION amrtree_tier_stats(index regclass,
	OUT tier text,
	OUT leaves bigint,
	OUT bytes bigint,
	OUT budget_bytes bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME'
LANGUAGE C STRICT VOLATILE PARALLEL RESTRICTED;
COMMENT ON FUNCTION amrtree_tier_stats(regclass) IS
'leaves and bytes of an amrtree index per tier (dram, pmem, ssd), with its PMEM budget';

CREATE FUNCTION amrtree_migration_stats(index regclass,
	OUT promotions bigint,
	OUT demotions bigint,
	OUT bytes_moved bigint,
	OUT budget_demotions bigint,
	OUT rule_demotions bigint,
	OUT scans bigint,
	OUT last_scan timestamptz)
RETURNS record
AS 'MODULE_PATHNAME'
LANGUAGE C STRICT VOLATILE PARALLEL RESTRICTED;
COMMENT ON FUNCTION amrtree_migration_stats(regclass) IS
'what the tier manager did to an amrtree index since the server started';

CREATE FUNCTION amrtree_ssd_cache_stats(
	OUT size_bytes bigint,
	OUT hits bigint,
	OUT device_reads bigint,
	OUT fills bigint)
RETURNS record
AS 'MODULE_PATHNAME'
LANGUAGE C STRICT VOLATILE PARALLEL RESTRICTED;
COMMENT ON FUNCTION amrtree_ssd_cache_stats() IS
'the DRAM cache of SSD leaf images (amrtree.ssd_cache_size): images it supplied, images read from the slot file, and images put in it, since the server started';
REVOKE ALL ON FUNCTION amrtree_ssd_cache_stats() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION amrtree_ssd_cache_stats() TO pg_monitor;

CREATE FUNCTION amrtree_leaf_table(index regclass,
	OUT leaf_id bigint,
	OUT tier text,
	OUT version bigint,
	OUT entries integer,
	OUT hotness float8,
	OUT mbr box)
RETURNS SETOF record
AS 'MODULE_PATHNAME'
LANGUAGE C STRICT VOLATILE PARALLEL RESTRICTED;
COMMENT ON FUNCTION amrtree_leaf_table(regclass) IS
'the Leaf Table entries of an amrtree index: one row per leaf';

CREATE FUNCTION amrtree_pool_stats(
	OUT pool text,
	OUT pmem_slots bigint,
	OUT pmem_slots_used bigint,
	OUT ssd_slots bigint,
	OUT ssd_slots_used bigint,
	OUT leaf_ids bigint,
	OUT leaf_ids_used bigint,
	OUT dram_nodes bigint,
	OUT dram_nodes_used bigint,
	OUT indexes integer,
	OUT rebuilds bigint)
RETURNS record
AS 'MODULE_PATHNAME'
LANGUAGE C STRICT VOLATILE PARALLEL RESTRICTED;
COMMENT ON FUNCTION amrtree_pool_stats() IS
'cluster-wide usage of the amrtree PMEM pool and DRAM area (pg_monitor)';
REVOKE ALL ON FUNCTION amrtree_pool_stats() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION amrtree_pool_stats() TO pg_monitor;
