/* amrtree_postgis--0.1.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION amrtree_postgis CASCADE" to load this file. \quit

-- The key of a geometry: the float4 box PostGIS's own index operators
-- compare (its BOX2DF), taken from PostGIS's box(geometry) and rounded
-- outward by amrtree (docs/design.md, "Operator classes").  Empty
-- geometries get a NaN box: the index hands them to the recheck.
CREATE FUNCTION amrtree_postgis_bbox(geometry) RETURNS box
AS '$libdir/amrtree', 'amrtree_float4_bbox'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- The operators and strategy numbers of PostGIS's gist_geometry_ops_2d.
-- The index filters by the boxes and the executor rechecks each operator;
-- <-> and <#> are ordered by a lower bound (the distance between the
-- boxes) and reordered by their exact values.
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
	FUNCTION	1	amrtree_postgis_bbox(geometry);
