--
-- amrtree_postgis: the operator class geometry_ops_2d answers each of
-- PostGIS's 2-D operators exactly as a sequential scan does (and as
-- PostGIS's own GiST index does, where that agrees with the operators), in
-- index scans and bitmap scans, and ORDER BY <-> / <#> returns rows in the
-- order of a sequential scan's sort.  Data: every kind
-- of geometry (points, lines, polygons with holes, multi*, collections,
-- curves, Z/M, empty ones), NULLs, duplicates, geometries whose exact boxes
-- are disjoint but whose float4 boxes (what PostGIS's operators compare)
-- touch, very large, infinite, NaN and tiny coordinates, and a few thousand
-- random geometries for trees of several levels.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS amrtree_postgis CASCADE;
RESET client_min_messages;
SET search_path = public, amrtree_postgis;
SELECT setseed(0.42);

-- the operator class validates, and is the default for geometry
SELECT opcname, opcdefault, amvalidate(oid) FROM pg_opclass
WHERE opcmethod = (SELECT oid FROM pg_am WHERE amname = 'amrtree')
  AND opcintype = 'geometry'::regtype;
-- the same operators with the same strategies as PostGIS's GiST class
SELECT a.amopstrategy, a.amopopr::regoperator, a.amoppurpose,
       a.amopopr = g.amopopr AND a.amoppurpose = g.amoppurpose AS same_as_gist
FROM pg_amop a
LEFT JOIN pg_amop g ON g.amopfamily = (SELECT opcfamily FROM pg_opclass WHERE opcname = 'gist_geometry_ops_2d')
                   AND g.amopstrategy = a.amopstrategy
WHERE a.amopfamily = (SELECT opcfamily FROM pg_opclass WHERE opcname = 'geometry_ops_2d'
                      AND opcmethod = (SELECT oid FROM pg_am WHERE amname = 'amrtree'))
ORDER BY a.amopstrategy;

-- ---- the key: PostGIS's float4 box, rounded outward ----
-- 0.1 is not a float: its box is the two floats around it.  The exact
-- boxes of the two points are disjoint, their float4 boxes overlap, and
-- PostGIS's && says they overlap.
SELECT geometry_bbox('POINT(0.1 0.1)') AS around_0_1,
       geometry_bbox('POINT(0.5 -2)') AS exact_floats,
       geometry_bbox('POINT(1e300 -1e300)') AS beyond_float,
       geometry_bbox('POINT(1e-300 0)') AS tiny,
       geometry_bbox('POINT EMPTY') AS empty,
       geometry_bbox('GEOMETRYCOLLECTION(POINT EMPTY)') AS empty_collection;
SELECT 'POINT(0.1 0.1)'::geometry && 'POINT(0.10000000001 0.1)'::geometry AS float_boxes_overlap,
       ST_XMax('POINT(0.1 0.1)'::geometry) < ST_XMin('POINT(0.10000000001 0.1)'::geometry) AS exact_boxes_apart;

-- ---- data ----
CREATE TABLE pg_geom (id serial, g geometry);
INSERT INTO pg_geom (g) SELECT g::geometry FROM unnest(ARRAY[
  'POINT(0 0)', 'POINT(1 1)', 'POINT(1 1)', 'POINT(-3 4)', 'POINT(0.1 0.1)',
  'POINT(0.1000000001 0.1)', 'POINT(0.0999999999 0.1)',
  'LINESTRING(0 0, 10 10)', 'LINESTRING(0.1 0.1, 0.1000000001 5)', 'LINESTRING(-5 -5, -5 5)',
  'POLYGON((0 0, 4 0, 4 4, 0 4, 0 0))', 'POLYGON((0 0, 4 0, 4 4, 0 4, 0 0))',
  'POLYGON((0 0, 10 0, 10 10, 0 10, 0 0), (2 2, 8 2, 8 8, 2 8, 2 2))',
  'POLYGON((0.3 0.3, 0.7 0.3, 0.5 0.7, 0.3 0.3))',
  'MULTIPOINT((1 1), (3 3), (-2 5))', 'MULTILINESTRING((0 0, 1 1), (5 5, 6 7))',
  'MULTIPOLYGON(((0 0, 1 0, 1 1, 0 0)), ((5 5, 6 5, 6 6, 5 5)))',
  'GEOMETRYCOLLECTION(POINT(2 3), LINESTRING(4 4, 5 6), POLYGON((7 7, 8 7, 8 8, 7 7)))',
  'GEOMETRYCOLLECTION(POINT(1 1), GEOMETRYCOLLECTION EMPTY)',
  'POINT EMPTY', 'LINESTRING EMPTY', 'POLYGON EMPTY', 'MULTIPOINT EMPTY', 'MULTIPOLYGON EMPTY',
  'GEOMETRYCOLLECTION EMPTY', 'GEOMETRYCOLLECTION(POINT EMPTY, LINESTRING EMPTY)',
  'POINT Z (1 2 3)', 'LINESTRING M (0 0 1, 2 2 3)', 'POINT ZM (3 3 3 3)',
  'CIRCULARSTRING(0 0, 1 1, 2 0)', 'CURVEPOLYGON(CIRCULARSTRING(0 0, 4 0, 4 4, 0 4, 0 0))',
  'POINT(1e30 1e30)', 'POINT(1.0000001e30 1e30)', 'LINESTRING(-1e38 -1e38, 1e38 1e38)',
  'POINT(1e300 -1e300)', 'POINT(3.5e38 0)', 'POINT(1e-40 1e-40)', 'POINT(-1e-300 1e-300)',
  'POINT(1e-45 0)', 'POINT(16777216 16777216)', 'POINT(16777217 16777217)',
  'POINT(16777218 16777218)']) g;
INSERT INTO pg_geom (g) VALUES (NULL), (NULL), (ST_MakePoint('Infinity', 0)),
  (ST_MakePoint('-Infinity', '-Infinity')), (ST_MakeLine(ST_MakePoint(0, 0), ST_MakePoint(1, 'Infinity'))),
  (ST_MakePoint('NaN', 'NaN')), (ST_MakePoint('NaN', 1)), (ST_MakePoint(2, 'NaN'));
-- exact boxes apart by less than float4 resolution: near 0.3 (where that
-- is below the 1e-6 fuzz of amrtree's box relations) and near 1e6 (float4
-- spacing 0.0625, 6e4 times the fuzz: web-mercator-sized coordinates)
INSERT INTO pg_geom (g)
SELECT CASE i % 3
  WHEN 0 THEN ST_MakePoint(c + k * d, 2 * c)
  WHEN 1 THEN ST_MakeLine(ST_MakePoint(3 * c + k * d, -c), ST_MakePoint(3 * c + k * d, c))
  ELSE ST_MakeEnvelope(5 * c + k * d, 5 * c, 7 * c, 7 * c + k * d) END
FROM (VALUES (0.1, 1e-9), (1e6, 0.01)) v(c, d), generate_series(-20, 20) k, generate_series(0, 2) i;
-- a dense cluster at 1e6 (points, boxes and lines a few float4 steps wide)
INSERT INTO pg_geom (g)
SELECT CASE i % 3
  WHEN 0 THEN ST_MakePoint(x, y)
  WHEN 1 THEN ST_MakeEnvelope(x, y, x + w, y + h)
  ELSE ST_MakeLine(ST_MakePoint(x, y + h), ST_MakePoint(x + w, y)) END
FROM (SELECT i, 1e6 + round(random() * 1e4) / 100 x, 2e6 + round(random() * 1e4) / 100 y,
             random() * 0.2 w, random() * 0.2 h
      FROM generate_series(1, 1500) i) s;
-- random geometries of every kind, NULL and empty ones among them
INSERT INTO pg_geom (g)
SELECT CASE WHEN i % 97 = 0 THEN NULL
            WHEN i % 89 = 0 THEN 'POLYGON EMPTY'::geometry
            ELSE CASE i % 7
  WHEN 0 THEN ST_MakePoint(x, y)
  WHEN 1 THEN ST_MakeLine(ST_MakePoint(x, y), ST_MakePoint(x + w, y + h))
  WHEN 2 THEN ST_MakeEnvelope(x, y, x + w, y + h)
  WHEN 3 THEN ST_Collect(ST_MakePoint(x, y), ST_MakePoint(x + w, y - h))
  WHEN 4 THEN ST_Multi(ST_MakeEnvelope(x, y, x + w, y + h))
  WHEN 5 THEN ST_Collect(ST_MakePoint(x, y), ST_MakeLine(ST_MakePoint(x + w, y), ST_MakePoint(x, y + h)))
  ELSE ST_MakePolygon(ST_MakeLine(ARRAY[ST_MakePoint(x, y), ST_MakePoint(x + w, y),
                                        ST_MakePoint(x, y + h), ST_MakePoint(x, y)])) END END
FROM (SELECT i, random() * 200 - 100 x, random() * 200 - 100 y, random() * 5 w, random() * 5 h
      FROM generate_series(1, 3000) i) s;
-- on a grid: duplicates, shared edges, degenerate boxes
INSERT INTO pg_geom (g)
SELECT CASE i % 3
  WHEN 0 THEN ST_MakePoint(x, y)
  WHEN 1 THEN ST_MakeEnvelope(x, y, x + w, y + h)
  ELSE ST_MakeLine(ST_MakePoint(x, y), ST_MakePoint(x + w, y + h)) END
FROM (SELECT i, round(random() * 40) / 2 - 10 x, round(random() * 40) / 2 - 10 y,
             round(random() * 2) / 2 w, round(random() * 2) / 2 h
      FROM generate_series(1, 1500) i) s;

-- the key holds only float4 values and covers the exact box
SELECT count(*) AS rows,
       count(*) FILTER (WHERE NOT ST_IsEmpty(g)) AS non_empty,
       count(*) FILTER (WHERE NOT ST_IsEmpty(g) AND
                        (b[0])[0]::float4::float8 IS DISTINCT FROM (b[0])[0] OR
                        (b[0])[1]::float4::float8 IS DISTINCT FROM (b[0])[1] OR
                        (b[1])[0]::float4::float8 IS DISTINCT FROM (b[1])[0] OR
                        (b[1])[1]::float4::float8 IS DISTINCT FROM (b[1])[1]) AS not_float4,
       count(*) FILTER (WHERE NOT ST_IsEmpty(g) AND NOT (b @> box(g))
                        AND ST_XMin(g) >= -3.4e38 AND ST_YMin(g) >= -3.4e38
                        AND ST_XMax(g) <= 3.4e38 AND ST_YMax(g) <= 3.4e38) AS not_covering,
       count(*) FILTER (WHERE ST_IsEmpty(g) AND b::text <> '(NaN,NaN),(NaN,NaN)') AS empty_not_nan
FROM (SELECT g, geometry_bbox(g) b FROM pg_geom WHERE g IS NOT NULL) s;

-- pg_geom with an amrtree index (the default operator class); its rows
-- without NaN coordinates and empty geometries twice more, with amrtree and
-- with PostGIS's GiST.  GiST is held to the sequential scan only on those:
-- on the others it disagrees with PostGIS's own operators (PostGIS 3.3: it
-- returns POINT(NaN 1) for && with any query, empty geometries for every
-- ~ and @, and none for ~= with an empty query).
CREATE TABLE pg_geom_plain AS SELECT * FROM pg_geom
WHERE g IS NULL OR NOT ST_IsEmpty(g) AND ST_AsText(g) NOT LIKE '%NaN%';
CREATE TABLE pg_geom_gist AS SELECT * FROM pg_geom_plain;
CREATE INDEX pg_geom_idx ON pg_geom USING amrtree (g);
CREATE INDEX pg_geom_plain_idx ON pg_geom_plain USING amrtree (g);
CREATE INDEX pg_geom_gist_idx ON pg_geom_gist USING gist (g);
SELECT c.relname, o.opcname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_opclass o ON o.oid = i.indclass[0] WHERE c.relname = 'pg_geom_idx';
VACUUM ANALYZE pg_geom, pg_geom_plain, pg_geom_gist;
SELECT height >= 2 AS several_levels, entries FROM amrtree_index_stats('pg_geom_idx');

-- ---- search operators ----
CREATE TABLE pg_q (qn serial, q geometry);
INSERT INTO pg_q (q) SELECT q::geometry FROM unnest(ARRAY[
  'POINT(0 0)', 'POINT(1 1)', 'POINT(-3 4)', 'POINT(0.10000000005 0.2)', 'POINT(0.1 0.1)',
  'POLYGON((0 0, 10 0, 10 10, 0 10, 0 0))', 'POLYGON((0 0, 4 0, 4 4, 0 4, 0 0))',
  'POLYGON((-50 -50, 50 -50, 50 50, -50 50, -50 -50))', 'LINESTRING(-100 0, 100 0)',
  'POLYGON((0.3 0.3, 0.499999999 0.3, 0.499999999 0.499999999, 0.3 0.499999999, 0.3 0.3))',
  'LINESTRING(0.3000000001 -1, 0.3000000001 1)', 'MULTIPOINT((-20 -20), (20 20))',
  'GEOMETRYCOLLECTION(POINT(5 5), LINESTRING(-5 -5, -6 -6))', 'CIRCULARSTRING(0 0, 1 1, 2 0)',
  'POINT EMPTY', 'GEOMETRYCOLLECTION EMPTY', 'POINT(1e30 1e30)',
  'LINESTRING(-1e300 -1e300, 1e300 1e300)', 'POINT(1e-40 1e-40)', 'POINT(16777217 16777217)',
  'POINT(-7.5 3)', 'POLYGON((-10 -10, -9.5 -10, -9.5 -9.5, -10 -9.5, -10 -10))',
  'POINT(1000000.02 2000000)', 'LINESTRING(3000000.03 0, 3000000.03 1)',
  'POINT(5000000.05 5000000.01)', 'POINT(1000050.03 2000050.03)',
  'POLYGON((1000020.01 2000020.01, 1000040.005 2000020.01, 1000040.005 2000040.005, 1000020.01 2000020.01))',
  'LINESTRING(1000000.01 2000099.99, 1000099.99 2000000.01)']) q;
INSERT INTO pg_q (q) VALUES (ST_MakePoint('Infinity', 0)), (ST_MakePoint('NaN', 'NaN'));

-- ids of the rows of tbl where "g <op> q" with only the given scan allowed;
-- the plan is checked (index tbl_idx), so that no comparison passes on two
-- sequential scans
CREATE FUNCTION pg_ids(tbl text, op text, q geometry, scan text)
RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE
  sql text := format('SELECT id FROM %s WHERE g %s %L::geometry', tbl, op, q);
  idx text := tbl || '_idx';
  plan text := '';
  r record;
  ids int[];
BEGIN
  PERFORM set_config('enable_seqscan', CASE WHEN scan = 'seq' THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_indexscan', CASE WHEN scan = 'index' THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_indexonlyscan', 'off', true);
  PERFORM set_config('enable_bitmapscan', CASE WHEN scan = 'bitmap' THEN 'on' ELSE 'off' END, true);
  FOR r IN EXECUTE 'EXPLAIN (COSTS OFF) ' || sql LOOP
    plan := plan || r."QUERY PLAN" || E'\n';
  END LOOP;
  IF scan = 'index' AND plan NOT LIKE '%Index Scan using ' || idx || ' %' OR
     scan = 'bitmap' AND plan NOT LIKE '%Bitmap Index Scan on ' || idx || E'\n%' OR
     scan = 'seq' AND plan NOT LIKE '%Seq Scan on%' THEN
    RAISE EXCEPTION 'plan does not use a % scan: %', scan, plan;
  END IF;
  EXECUTE 'SELECT coalesce(array_agg(id ORDER BY id), ''{}'') FROM (' || sql || ') s' INTO ids;
  PERFORM set_config('enable_seqscan', 'on', true);
  PERFORM set_config('enable_indexscan', 'on', true);
  PERFORM set_config('enable_indexonlyscan', 'on', true);
  PERFORM set_config('enable_bitmapscan', 'on', true);
  RETURN ids;
END $$;

CREATE TABLE pg_result AS
SELECT op, qn, q,
       pg_ids('pg_geom', op, q, 'seq') AS seq,
       pg_ids('pg_geom', op, q, 'index') AS amr_index,
       pg_ids('pg_geom', op, q, 'bitmap') AS amr_bitmap,
       pg_ids('pg_geom_plain', op, q, 'index') AS plain_index,
       pg_ids('pg_geom_gist', op, q, 'index') AS gist_index
FROM unnest(ARRAY['<<', '&<', '&&', '&>', '>>', '~=', '~', '@', '&<|', '<<|', '|>>', '|&>']) op,
     pg_q;

SELECT op, count(*) AS comparisons,
       count(*) FILTER (WHERE amr_index <> seq) AS index_vs_seq,
       count(*) FILTER (WHERE amr_bitmap <> seq) AS bitmap_vs_seq,
       count(*) FILTER (WHERE plain_index <> gist_index) AS plain_amrtree_vs_gist,
       count(*) FILTER (WHERE cardinality(seq) > 0) AS queries_with_rows
FROM pg_result GROUP BY op ORDER BY op;
SELECT op, qn, ST_AsText(q) AS q, cardinality(seq) AS seq, cardinality(amr_index) AS amr_index,
       cardinality(amr_bitmap) AS amr_bitmap, cardinality(plain_index) AS plain_index,
       cardinality(gist_index) AS gist_index
FROM pg_result
WHERE amr_index <> seq OR amr_bitmap <> seq OR plain_index <> gist_index
ORDER BY op, qn LIMIT 10;
-- pairs that only the float4 boxes make overlap (the exact boxes are
-- apart): each was found by the index scan, as every pair above
SELECT count(*) AS float_only_pairs FROM pg_geom t, pg_q
WHERE t.g && q AND NOT (ST_XMin(t.g) <= ST_XMax(q) AND ST_XMin(q) <= ST_XMax(t.g) AND
                        ST_YMin(t.g) <= ST_YMax(q) AND ST_YMin(q) <= ST_YMax(t.g));

-- A negative control: an operator class keyed on the exact float8 box
-- (PostGIS's box(geometry)) instead of the float4 one misses rows that the
-- operators return; the data above shows it.
CREATE FUNCTION pg_exact_bbox(geometry) RETURNS box LANGUAGE sql IMMUTABLE STRICT
AS $$ SELECT coalesce(box($1), box(point('NaN', 'NaN'))) $$;
CREATE OPERATOR CLASS pg_exact_ops FOR TYPE geometry USING amrtree AS
	OPERATOR 1 << (geometry, geometry), OPERATOR 2 &< (geometry, geometry),
	OPERATOR 3 && (geometry, geometry), OPERATOR 4 &> (geometry, geometry),
	OPERATOR 5 >> (geometry, geometry), OPERATOR 6 ~= (geometry, geometry),
	OPERATOR 7 ~ (geometry, geometry), OPERATOR 8 @ (geometry, geometry),
	OPERATOR 9 &<| (geometry, geometry), OPERATOR 10 <<| (geometry, geometry),
	OPERATOR 11 |>> (geometry, geometry), OPERATOR 12 |&> (geometry, geometry),
	FUNCTION 1 pg_exact_bbox(geometry);
CREATE TABLE pg_geom_exact AS SELECT * FROM pg_geom;
CREATE INDEX pg_geom_exact_idx ON pg_geom_exact USING amrtree (g pg_exact_ops);
SELECT count(*) FILTER (WHERE pg_ids('pg_geom_exact', op, q, 'index') <> seq) > 0 AS exact_box_misses_rows
FROM pg_result;
DROP TABLE pg_geom_exact;
DROP OPERATOR CLASS pg_exact_ops USING amrtree;
DROP OPERATOR FAMILY pg_exact_ops USING amrtree;
DROP FUNCTION pg_exact_bbox(geometry);

-- rows are decided by the operator, rechecked on the heap row
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT id FROM pg_geom WHERE g && 'POINT(0.1 0.1)'::geometry;
SELECT array_agg(id ORDER BY id) FROM pg_geom WHERE g && 'POINT(0.1 0.1)'::geometry;
SELECT count(*) FROM pg_geom WHERE g IS NULL;
RESET enable_seqscan;
RESET enable_bitmapscan;

-- ---- KNN ----
-- The first k rows by "g <op> q" (op <-> or <#>) with only the given scan
-- allowed (an index scan must do the ordering itself), as text: the
-- distances in the order returned, and the ids of the rows closer than the
-- last one, sorted (rows tied with the last one may differ between two
-- correct answers).
CREATE FUNCTION pg_knn(tbl text, op text, q geometry, k int, scan text, filter text DEFAULT 'true')
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  sql text := format('SELECT id, g %s %L::geometry AS d FROM %s WHERE %s ORDER BY g %s %L::geometry LIMIT %s',
                     op, q, tbl, filter, op, q, k);
  idx text := tbl || '_idx';
  plan text := '';
  r record;
  result text;
BEGIN
  PERFORM set_config('enable_seqscan', CASE WHEN scan = 'seq' THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_indexscan', CASE WHEN scan = 'index' THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_bitmapscan', 'off', true);
  FOR r IN EXECUTE 'EXPLAIN (COSTS OFF) ' || sql LOOP
    plan := plan || r."QUERY PLAN" || E'\n';
  END LOOP;
  IF scan = 'index' AND (plan NOT LIKE '%Index Scan using ' || idx || ' %' OR
                         plan NOT LIKE '%Order By: (g ' || op || ' %') OR
     scan = 'seq' AND plan NOT LIKE '%Seq Scan on%' THEN
    RAISE EXCEPTION 'plan does not use a % scan: %', scan, plan;
  END IF;
  EXECUTE 'SELECT coalesce(array_agg(d ORDER BY n), ''{}'')::text || '' '' || ' ||
          'coalesce(array_agg(id ORDER BY d, id) FILTER (WHERE d < last OR last IS NULL AND d IS NOT NULL), ''{}'')::text ' ||
          'FROM (SELECT id, d, n, last_value(d) OVER (ORDER BY n ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) last ' ||
          'FROM (SELECT id, d, row_number() OVER () n FROM (' || sql || ') s) s) s' INTO result;
  PERFORM set_config('enable_seqscan', 'on', true);
  PERFORM set_config('enable_indexscan', 'on', true);
  PERFORM set_config('enable_bitmapscan', 'on', true);
  RETURN result;
END $$;

CREATE TABLE pg_knn_q (q geometry);
INSERT INTO pg_knn_q SELECT q::geometry FROM unnest(ARRAY[
  'POINT(0 0)', 'POINT(0.1 0.2)', 'POINT(55.5 -20.25)', 'POINT(1000 1000)', 'POINT(1e30 1e30)',
  'POINT(-9.75 -9.75)', 'POLYGON((0 0, 10 0, 10 10, 0 10, 0 0))',
  'POLYGON((-30 -30, -20 -30, -25 -20, -30 -30))', 'LINESTRING(-100 0, 100 0)',
  'MULTIPOINT((-60 60), (60 -60))', 'POINT EMPTY', 'POINT(1000050.03 2000050.03)',
  'POLYGON((1000020.01 2000020.01, 1000040.005 2000020.01, 1000040.005 2000040.005, 1000020.01 2000020.01))']) q;
CREATE TABLE pg_knn_result AS
SELECT op, ST_AsText(q) AS q, k,
       pg_knn('pg_geom', op, q, k, 'seq') AS seq,
       pg_knn('pg_geom', op, q, k, 'index') AS amr_index,
       pg_knn('pg_geom_plain', op, q, k, 'index') AS plain_index,
       pg_knn('pg_geom_gist', op, q, k, 'index') AS gist_index
FROM unnest(ARRAY['<->', '<#>']) op, pg_knn_q, unnest(ARRAY[1, 10, 100]) k;
SELECT op, count(*) AS comparisons,
       count(*) FILTER (WHERE amr_index <> seq) AS index_vs_seq,
       count(*) FILTER (WHERE plain_index <> gist_index) AS plain_amrtree_vs_gist
FROM pg_knn_result GROUP BY op ORDER BY op;
SELECT op, q, k, left(seq, 60) AS seq, left(amr_index, 60) AS amr_index FROM pg_knn_result
WHERE amr_index <> seq OR plain_index <> gist_index ORDER BY op, q, k LIMIT 5;

-- every row (NULL distances last), and with a search condition too
SELECT op,
       pg_knn('pg_geom', op, 'POINT(1 1)', 100000, 'index') =
       pg_knn('pg_geom', op, 'POINT(1 1)', 100000, 'seq') AS all_rows_match,
       pg_knn('pg_geom', op, 'POINT(1 1)', 50, 'index', 'g && ''POLYGON((0 0, 9 0, 9 9, 0 0))''::geometry') =
       pg_knn('pg_geom', op, 'POINT(1 1)', 50, 'seq', 'g && ''POLYGON((0 0, 9 0, 9 9, 0 0))''::geometry') AS filtered_match
FROM unnest(ARRAY['<->', '<#>']) op ORDER BY op;

SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT id FROM pg_geom ORDER BY g <-> 'POINT(1 1)'::geometry LIMIT 3;
SELECT id, ST_AsText(g), g <-> 'POINT(1 1)'::geometry AS d FROM pg_geom
ORDER BY g <-> 'POINT(1 1)'::geometry, id LIMIT 4;
SELECT id, ST_AsText(g), g <#> 'POLYGON((0 0, 1 0, 1 1, 0 0))'::geometry AS d FROM pg_geom
ORDER BY g <#> 'POLYGON((0 0, 1 0, 1 1, 0 0))'::geometry, id LIMIT 4;
-- nearest-neighbour join: a rescan per outer row
SELECT count(*) AS probes, count(*) FILTER (WHERE n.id IS NOT NULL) AS found
FROM (SELECT ST_MakePoint(i * 7, -i * 5) AS p FROM generate_series(-10, 10) i) probes
CROSS JOIN LATERAL (SELECT id FROM pg_geom ORDER BY g <-> probes.p LIMIT 1) n;
RESET enable_seqscan;

-- PostGIS adds the index condition to ST_Intersects, ST_DWithin, ... only
-- for GiST, SP-GiST and BRIN indexes; with amrtree it is written out, as
-- PostGIS would add it (ST_DWithin: && with the expanded query)
CREATE TABLE pg_st AS
SELECT (SELECT array_agg(id ORDER BY id) FROM pg_geom
        WHERE ST_DWithin(g, 'POINT(1 1)'::geometry, 2)) AS dwithin,
       (SELECT array_agg(id ORDER BY id) FROM pg_geom
        WHERE ST_Intersects(g, 'POLYGON((0 0, 5 0, 0 5, 0 0))'::geometry)) AS intersects;
SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT id FROM pg_geom
WHERE g && ST_Expand('POINT(1 1)'::geometry, 2) AND ST_DWithin(g, 'POINT(1 1)'::geometry, 2);
SELECT (SELECT array_agg(id ORDER BY id) FROM pg_geom
        WHERE g && ST_Expand('POINT(1 1)'::geometry, 2)
          AND ST_DWithin(g, 'POINT(1 1)'::geometry, 2)) = dwithin AS dwithin_match,
       (SELECT array_agg(id ORDER BY id) FROM pg_geom
        WHERE g && 'POLYGON((0 0, 5 0, 0 5, 0 0))'::geometry
          AND ST_Intersects(g, 'POLYGON((0 0, 5 0, 0 5, 0 0))'::geometry)) = intersects AS intersects_match,
       cardinality(dwithin) AS dwithin_rows, cardinality(intersects) AS intersects_rows
FROM pg_st;
RESET enable_seqscan;
DROP TABLE pg_st;

-- the support function finds PostGIS's functions whatever search_path says
-- (autovacuum and maintenance commands may run with an empty one)
SET search_path = '';
CREATE TABLE public.pg_sp (id int, g public.geometry);
CREATE INDEX pg_sp_idx ON public.pg_sp USING amrtree (g);
INSERT INTO public.pg_sp SELECT i, public.st_makepoint(i / 10.0, 0.1) FROM generate_series(1, 100) i;
INSERT INTO public.pg_sp VALUES (0, public.st_makepoint(0.10000000001, 0.1));
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT id FROM public.pg_sp WHERE g OPERATOR(public.&&) 'POINT(0.1 0.1)'::public.geometry;
SELECT array_agg(id ORDER BY id) FROM public.pg_sp WHERE g OPERATOR(public.&&) 'POINT(0.1 0.1)'::public.geometry;
SELECT amrtree_postgis.geometry_bbox('POINT(0.1 0.1)'::public.geometry);
RESET enable_seqscan;
RESET enable_bitmapscan;
DROP TABLE public.pg_sp;
RESET search_path;

-- declared for a type whose schema lacks PostGIS's functions: a clear error
CREATE FUNCTION pg_bad_bbox(point) RETURNS box
AS 'amrtree_postgis', 'amrtree_postgis_bbox' LANGUAGE C IMMUTABLE STRICT;
SELECT pg_bad_bbox('(1,2)');
DROP FUNCTION pg_bad_bbox(point);

-- ---- after inserts that split leaves, deletes and VACUUM ----
INSERT INTO pg_geom (g)
SELECT CASE WHEN i % 2 = 0 THEN ST_MakePoint(x, y) ELSE ST_MakeEnvelope(x, y, x + 0.25, y + 0.25) END
FROM (SELECT i, random() * 10 x, random() * 10 y FROM generate_series(1, 3000) i) s;
INSERT INTO pg_geom (g) VALUES ('POINT EMPTY'), (NULL), ('POINT(0.1000000002 0.2)');
DELETE FROM pg_geom WHERE id % 5 = 0;
VACUUM pg_geom;
SELECT amrtree_check('pg_geom_idx');
SELECT count(*) AS comparisons,
       count(*) FILTER (WHERE pg_ids('pg_geom', op, q, 'index') <> pg_ids('pg_geom', op, q, 'seq')) AS index_vs_seq,
       count(*) FILTER (WHERE pg_ids('pg_geom', op, q, 'bitmap') <> pg_ids('pg_geom', op, q, 'seq')) AS bitmap_vs_seq
FROM unnest(ARRAY['<<', '&<', '&&', '&>', '>>', '~=', '~', '@', '&<|', '<<|', '|>>', '|&>']) op, pg_q;
SELECT count(*) AS comparisons,
       count(*) FILTER (WHERE pg_knn('pg_geom', op, q, 25, 'index') <> pg_knn('pg_geom', op, q, 25, 'seq')) AS knn_vs_seq
FROM unnest(ARRAY['<->', '<#>']) op, pg_knn_q;

-- a REINDEX builds the same answers
REINDEX INDEX pg_geom_idx;
SELECT count(*) AS comparisons,
       count(*) FILTER (WHERE pg_ids('pg_geom', op, q, 'index') <> pg_ids('pg_geom', op, q, 'seq')) AS index_vs_seq
FROM unnest(ARRAY['&&', '~', '@', '~=']) op, pg_q;

DROP TABLE pg_geom, pg_geom_plain, pg_geom_gist, pg_q, pg_result, pg_knn_q, pg_knn_result;
DROP FUNCTION pg_ids(text, text, geometry, text);
DROP FUNCTION pg_knn(text, text, geometry, int, text, text);
-- PostGIS cannot be dropped from under the operator class
DROP EXTENSION postgis;
DROP EXTENSION amrtree_postgis;
