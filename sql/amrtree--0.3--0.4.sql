/* amrtree--0.3--0.4.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION amrtree UPDATE TO '0.4'" to load this file. \quit

-- KNN: ORDER BY box <-> point
ALTER OPERATOR FAMILY box_ops USING amrtree ADD
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
