/* amrtree--0.4.sql */

-- Privileges follow PostgreSQL's own rules for index inspection:
--  * functions that describe an index's shape or placement need SELECT on
--    its table (checked in C);
--  * functions that show raw leaf contents (keys, TIDs, leaf boxes, which
--    include other sessions' uncommitted rows) are for superusers, as
--    pageinspect's are, and refuse tables with row-level security in force
--    for the caller; an administrator may GRANT them;
--  * amrtree_settle, which makes the tier manager move leaves, and
--    amrtree_check, which holds the index's inserts while it runs, need
--    ownership of the index (checked in C; the check's pool-wide part runs
--    for superusers only);
--  * cluster-wide monitoring is granted to pg_monitor here, not checked in
--    C, so that administrators can GRANT or REVOKE it.

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
	OPERATOR	12	|&> (box, box),
	OPERATOR	15	<-> (box, point) FOR ORDER BY pg_catalog.float_ops;

-- Bounding boxes of the built-in geometric types (support function 1) and
-- the point a point's box stands for (support function 2); see
-- docs/design.md, "Operator classes".
CREATE FUNCTION amrtree_point_bbox(point) RETURNS box
AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION amrtree_point_fetch(box) RETURNS point
AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION amrtree_poly_bbox(polygon) RETURNS box
AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION amrtree_circle_bbox(circle) RETURNS box
AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- GiST's point_ops: exact (the key is the point), so no recheck.
CREATE OPERATOR CLASS point_ops
DEFAULT FOR TYPE point USING amrtree AS
	OPERATOR	1	<<  (point, point),
	OPERATOR	5	>>  (point, point),
	OPERATOR	6	~=  (point, point),
	OPERATOR	10	<<| (point, point),
	OPERATOR	11	|>> (point, point),
	OPERATOR	15	<-> (point, point) FOR ORDER BY pg_catalog.float_ops,
	OPERATOR	28	<@  (point, box),
	OPERATOR	29	<^  (point, point),
	OPERATOR	30	>^  (point, point),
	OPERATOR	48	<@  (point, polygon),
	OPERATOR	68	<@  (point, circle),
	FUNCTION	1	amrtree_point_bbox(point),
	FUNCTION	2	amrtree_point_fetch(box),
	FUNCTION	1	(polygon, polygon) amrtree_poly_bbox(polygon),
	FUNCTION	1	(circle, circle) amrtree_circle_bbox(circle);

-- GiST's poly_ops and circle_ops: the key is the bounding box, the
-- executor rechecks each operator (and reorders by the exact distance).
CREATE OPERATOR CLASS poly_ops
DEFAULT FOR TYPE polygon USING amrtree AS
	OPERATOR	1	<<  (polygon, polygon),
	OPERATOR	2	&<  (polygon, polygon),
	OPERATOR	3	&&  (polygon, polygon),
	OPERATOR	4	&>  (polygon, polygon),
	OPERATOR	5	>>  (polygon, polygon),
	OPERATOR	6	~=  (polygon, polygon),
	OPERATOR	7	@>  (polygon, polygon),
	OPERATOR	8	<@  (polygon, polygon),
	OPERATOR	9	&<| (polygon, polygon),
	OPERATOR	10	<<| (polygon, polygon),
	OPERATOR	11	|>> (polygon, polygon),
	OPERATOR	12	|&> (polygon, polygon),
	OPERATOR	15	<-> (polygon, point) FOR ORDER BY pg_catalog.float_ops,
	FUNCTION	1	amrtree_poly_bbox(polygon);

CREATE OPERATOR CLASS circle_ops
DEFAULT FOR TYPE circle USING amrtree AS
	OPERATOR	1	<<  (circle, circle),
	OPERATOR	2	&<  (circle, circle),
	OPERATOR	3	&&  (circle, circle),
	OPERATOR	4	&>  (circle, circle),
	OPERATOR	5	>>  (circle, circle),
	OPERATOR	6	~=  (circle, circle),
	OPERATOR	7	@>  (circle, circle),
	OPERATOR	8	<@  (circle, circle),
	OPERATOR	9	&<| (circle, circle),
	OPERATOR	10	<<| (circle, circle),
	OPERATOR	11	|>> (circle, circle),
	OPERATOR	12	|&> (circle, circle),
	OPERATOR	15	<-> (circle, point) FOR ORDER BY pg_catalog.float_ops,
	FUNCTION	1	amrtree_circle_bbox(circle);

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
	OUT ssd_bytes bigint,
	OUT status text)
RETURNS record
AS 'MODULE_PATHNAME'
LANGUAGE C STRICT VOLATILE PARALLEL RESTRICTED;
COMMENT ON FUNCTION amrtree_index_stats(regclass) IS
'shape and size of an amrtree index per tier, and whether this server has its tree (status)';

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
REVOKE ALL ON FUNCTION amrtree_leaf_entries(regclass) FROM PUBLIC;

CREATE FUNCTION amrtree_settle(index regclass, settle_seconds float8 DEFAULT 5)
RETURNS bigint
AS 'MODULE_PATHNAME'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;
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
REVOKE ALL ON FUNCTION amrtree_leaf_table(regclass) FROM PUBLIC;

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
