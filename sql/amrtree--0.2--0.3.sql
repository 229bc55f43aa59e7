/* amrtree--0.2--0.3.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION amrtree UPDATE TO '0.3'" to load this file. \quit

-- amrtree_index_stats gains a status column: whether this server has the
-- index's tree, or rebuilds it (an index whose pool was lost)
DROP FUNCTION amrtree_index_stats(regclass);
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
