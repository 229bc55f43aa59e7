/* amrtree_postgis--0.1.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION amrtree_postgis CASCADE" to load this file. \quit

-- The extension lives in schema amrtree_postgis (the control file); the
-- types and operators of PostGIS are found through search_path, which
-- CREATE EXTENSION sets to our schema followed by those of the required
-- extensions (amrtree, postgis).

-- Support function 1: the float4 box, rounded outward, that PostGIS's own
-- 2-D operators compare (its index key, BOX2DF), as a box; a box of NaNs
-- for an empty geometry.
CREATE FUNCTION geometry_bbox(geometry) RETURNS box
AS 'MODULE_PATHNAME', 'amrtree_postgis_bbox'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION geometry_bbox(geometry) IS
'the bounding box PostGIS''s 2-D operators compare: float4, rounded outward; NaN for an empty geometry (support function 1 of geometry_ops_2d)';

-- PostGIS's gist_geometry_ops_2d, operator for operator and strategy for
-- strategy.  The key is the bounding box; amrtree filters with a box
-- relation every matching row satisfies and the executor rechecks the
-- operator on the row; <-> and <#> are ordered by a lower bound (the
-- distance between the boxes) and reordered by the exact distance.
CREATE OPERATOR CLASS geometry_ops_2d
DEFAULT FOR TYPE geometry USING amrtree AS
	OPERATOR	1	<<  (geometry, geometry),
	OPERATOR	2	&<  (geometry, geometry),
	OPERATOR	3	&&  (geometry, geometry),
	OPERATOR	4	&>  (geometry, geometry),
	OPERATOR	5	>>  (geometry, geometry),
	OPERATOR	6	~=  (geometry, geometry),
	OPERATOR	7	~   (geometry, geometry),
	OPERATOR	8	@   (geometry, geometry),
	OPERATOR	9	&<| (geometry, geometry),
	OPERATOR	10	<<| (geometry, geometry),
	OPERATOR	11	|>> (geometry, geometry),
	OPERATOR	12	|&> (geometry, geometry),
	OPERATOR	13	<-> (geometry, geometry) FOR ORDER BY pg_catalog.float_ops,
	OPERATOR	14	<#> (geometry, geometry) FOR ORDER BY pg_catalog.float_ops,
	FUNCTION	1	geometry_bbox(geometry);
