/* amrtree_postgis--0.1--0.2.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION amrtree_postgis UPDATE TO '0.2'" to load this file. \quit

-- The key of a geography: the longitudes and latitudes (degrees) of the
-- directions of the points of its geocentric box, the float4 box in three
-- dimensions that PostGIS's own && compares (taken from gist_geography_ops'
-- compress function).  Overlapping geocentric boxes have overlapping keys,
-- so the index filters for && and the executor rechecks it (docs/design.md,
-- "Geography keys").  Empty geographies get a NaN box.
CREATE FUNCTION amrtree_geography_bbox(geography) RETURNS box
AS '$libdir/amrtree', 'amrtree_geography_bbox'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- A lower bound, in metres, of geography <-> geography between values whose
-- keys lie in the two boxes: the great-circle gap between the boxes on a
-- sphere no larger than the Earth.
CREATE FUNCTION amrtree_geography_distance(box, box) RETURNS float8
AS '$libdir/amrtree', 'amrtree_geography_distance'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- The operators and strategy numbers of PostGIS's gist_geography_ops, so
-- that ST_DWithin, ST_Intersects, ST_Covers and the rest are planned on the
-- index as they are on GiST (the planner's GiST twin, docs/design.md).
CREATE OPERATOR CLASS geography_ops
DEFAULT FOR TYPE geography USING amrtree AS
	OPERATOR	3	&&  (geography, geography),
	OPERATOR	13	<-> (geography, geography) FOR ORDER BY pg_catalog.float_ops,
	FUNCTION	1	amrtree_geography_bbox(geography),
	FUNCTION	3	amrtree_geography_distance(box, box);
