--
-- amrtree_postgis: the geometry operator class answers every operator of
-- PostGIS's gist_geometry_ops_2d exactly as a sequential scan and as
-- PostGIS's GiST index do, and orders by <-> and <#> as a sequential scan's
-- sort does, on points, lines, polygons, collections, empty geometries,
-- NULLs, duplicates, huge and tiny coordinates, and geometries whose float4
-- boxes touch while their float8 boxes do not.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS amrtree_postgis CASCADE;
RESET client_min_messages;
SELECT setseed(0.5);

SELECT opcname, amvalidate(oid) FROM pg_opclass
WHERE opcmethod = (SELECT oid FROM pg_am WHERE amname = 'amrtree') AND opcname = 'geometry_ops_2d';

CREATE TABLE pg_geo (id serial, g geometry);
INSERT INTO pg_geo (g) VALUES
  ('POINT(0 0)'), ('POINT(1 1)'), ('POINT(1 1)'), ('LINESTRING(0 0, 10 10)'),
  ('POLYGON((0 0, 4 0, 4 4, 0 4, 0 0))'), ('POLYGON((5 5, 6 5, 6 6, 5 5))'),
  ('MULTIPOINT((2 2), (8 8))'), ('GEOMETRYCOLLECTION(POINT(3 3), LINESTRING(7 0, 9 1))'),
  ('POINT EMPTY'), ('POLYGON EMPTY'), ('GEOMETRYCOLLECTION EMPTY'), (NULL), (NULL),
  ('POINT(1e30 -1e30)'), ('LINESTRING(-1e-30 -1e-30, 1e-30 1e-30)'),
  -- float8 boxes a hair apart whose float4 boxes (rounded outward) touch
  ('POINT(100.000001 50)'), ('POINT(100.0000011 50)'), ('LINESTRING(100.0000012 50, 101 51)'),
  ('POLYGON((100.0000013 49, 102 49, 102 50.0000001, 100.0000013 49))'),
  -- beyond float4 (PostGIS clamps its boxes to +-FLT_MAX), infinite, NaN,
  -- and coarse float4 steps (0.0625 near 1e6, 2 near 1.7e7)
  ('POINT(3.5e38 0)'), (ST_MakePoint('Infinity', 0)), (ST_MakePoint('-Infinity', '-Infinity')),
  (ST_MakeLine(ST_MakePoint(0, 0), ST_MakePoint(1, 'Infinity'))), ('LINESTRING(-1e38 -1e38, 1e38 1e38)'),
  ('POINT(1e-40 1e-40)'), (ST_MakePoint('NaN', 1)), ('POINT(1000000 1000000)'), ('POINT(1000000.01 1000000)'),
  ('POINT(16777217 16777217)'), ('POINT(16777218 16777218)');
INSERT INTO pg_geo (g)
SELECT CASE i % 4
         WHEN 0 THEN ST_MakePoint(x, y)
         WHEN 1 THEN ST_MakeLine(ST_MakePoint(x, y), ST_MakePoint(x + w, y + h))
         WHEN 2 THEN ST_MakeEnvelope(x, y, x + w, y + h)
         ELSE ST_Buffer(ST_MakePoint(x, y), w, 2) END
FROM (SELECT i, random() * 200 - 100 x, random() * 100 - 50 y, random() * 3 w, random() * 3 h
      FROM generate_series(1, 4000) i) s;

CREATE TABLE pg_amr AS SELECT * FROM pg_geo;
CREATE TABLE pg_gist AS SELECT * FROM pg_geo;
CREATE INDEX pg_amr_g ON pg_amr USING amrtree (g);
CREATE INDEX pg_gist_g ON pg_gist USING gist (g);
VACUUM ANALYZE pg_amr;
VACUUM ANALYZE pg_gist;
SELECT amrtree_check('pg_amr_g');

CREATE TABLE pg_q (q geometry);
INSERT INTO pg_q VALUES ('POINT(1 1)'), ('POLYGON((0 0, 4 0, 4 4, 0 4, 0 0))'),
  ('LINESTRING(-50 -20, 50 20)'), ('POINT(100.0000011 50)'), ('POINT(100.000001 50)'),
  ('POLYGON((-100 -50, 100 -50, 100 50, -100 50, -100 -50))'), ('MULTIPOINT((5 5), (-5 -5))'),
  ('POINT EMPTY'), ('POLYGON((100 49, 103 49, 103 52, 100 49))'),
  (ST_MakePoint('Infinity', 0)), ('POINT(3.5e38 0)'), ('POINT(1000000.03 1000000)'),
  ('POINT(16777217 16777217)');
INSERT INTO pg_q SELECT ST_MakeEnvelope(x, y, x + 10, y + 5)
FROM (SELECT random() * 200 - 100 x, random() * 100 - 50 y FROM generate_series(1, 6)) s;

CREATE TABLE pg_ops (op text);
INSERT INTO pg_ops VALUES ('<<'), ('&<'), ('&&'), ('&>'), ('>>'), ('~='), ('~'), ('@'),
  ('&<|'), ('<<|'), ('|>>'), ('|&>');

-- ids matching "g <op> q" with only the given scan allowed (plan checked)
CREATE FUNCTION pg_ids(tbl text, op text, q geometry, scan text)
RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE
  sql text := format('SELECT id FROM %s WHERE g %s %L::geometry', tbl, op, q);
  plan text := '';
  r record;
  ids int[];
BEGIN
  PERFORM set_config('enable_seqscan', CASE WHEN scan = 'seq' THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_indexscan', CASE WHEN scan = 'index' THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_bitmapscan', CASE WHEN scan = 'bitmap' THEN 'on' ELSE 'off' END, true);
  FOR r IN EXECUTE 'EXPLAIN (COSTS OFF) ' || sql LOOP
    plan := plan || r."QUERY PLAN" || E'\n';
  END LOOP;
  IF scan = 'index' AND plan NOT LIKE '%Index Scan using%' OR
     scan = 'bitmap' AND plan NOT LIKE '%Bitmap Index Scan on%' OR
     scan = 'seq' AND plan NOT LIKE '%Seq Scan on%' THEN
    RAISE EXCEPTION 'plan does not use a % scan: %', scan, plan;
  END IF;
  EXECUTE 'SELECT coalesce(array_agg(id ORDER BY id), ''{}'') FROM (' || sql || ') s' INTO ids;
  PERFORM set_config('enable_seqscan', 'on', true);
  PERFORM set_config('enable_indexscan', 'on', true);
  PERFORM set_config('enable_bitmapscan', 'on', true);
  RETURN ids;
END $$;

CREATE TABLE pg_result AS
SELECT op, q,
       pg_ids('pg_amr', op, q, 'seq') AS seq,
       pg_ids('pg_amr', op, q, 'index') AS amr_index,
       pg_ids('pg_amr', op, q, 'bitmap') AS amr_bitmap,
       pg_ids('pg_gist', op, q, 'index') AS gist_index
FROM pg_ops, pg_q;
-- amrtree is held to the sequential scan everywhere, and to PostGIS's GiST
-- where GiST agrees with the sequential scan: GiST does not recheck ~ and @
-- on points whose float4 boxes grow when rounded, nor ~= on empty
-- geometries, and returns rows the operator rejects (or misses some)
SELECT count(*) AS comparisons,
       count(*) FILTER (WHERE amr_index <> seq) AS index_vs_seq,
       count(*) FILTER (WHERE amr_bitmap <> seq) AS bitmap_vs_seq,
       count(*) FILTER (WHERE gist_index = seq AND amr_index <> gist_index) AS amrtree_vs_gist,
       count(*) FILTER (WHERE gist_index <> seq) AS gist_vs_seq,
       count(*) FILTER (WHERE cardinality(seq) > 0) AS queries_with_rows
FROM pg_result;
SELECT op, left(ST_AsText(q), 40) AS q, cardinality(seq) AS seq, cardinality(amr_index) AS amr_index,
       cardinality(amr_bitmap) AS amr_bitmap
FROM pg_result WHERE amr_index <> seq OR amr_bitmap <> seq LIMIT 5;
-- the rows whose float4 boxes touch: && finds what PostGIS finds
SELECT pg_ids('pg_amr', '&&', 'POINT(100.0000011 50)', 'index') AS touching;

-- KNN: the first k rows by "g <op> q" (distances in order, and the ids of
-- the rows closer than the last one), index scan with Order By vs sort
CREATE FUNCTION pg_knn(tbl text, op text, q geometry, k int, scan text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  sql text := format('SELECT id, g %s %L::geometry AS d FROM %s ORDER BY g %s %L::geometry LIMIT %s',
                     op, q, tbl, op, q, k);
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
  IF scan = 'index' AND plan NOT LIKE '%Order By: (g %' OR
     scan = 'seq' AND plan NOT LIKE '%Seq Scan on%' THEN
    RAISE EXCEPTION 'plan does not use a % scan: %', scan, plan;
  END IF;
  EXECUTE 'SELECT coalesce(array_agg(round(d::numeric, 9) ORDER BY n), ''{}'')::text || '' '' || ' ||
          'coalesce(array_agg(id ORDER BY d, id) FILTER (WHERE d < last OR last IS NULL AND d IS NOT NULL), ''{}'')::text ' ||
          'FROM (SELECT id, d, n, last_value(d) OVER (ORDER BY n ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) last ' ||
          'FROM (SELECT id, d, row_number() OVER () n FROM (' || sql || ') s) s) s' INTO result;
  PERFORM set_config('enable_seqscan', 'on', true);
  PERFORM set_config('enable_indexscan', 'on', true);
  PERFORM set_config('enable_bitmapscan', 'on', true);
  RETURN result;
END $$;

CREATE TABLE pg_knn_result AS
SELECT op, q, k,
       pg_knn('pg_amr', op, q, k, 'seq') AS seq,
       pg_knn('pg_amr', op, q, k, 'index') AS amr_index
FROM unnest(ARRAY['<->', '<#>']) op,
     (SELECT q FROM pg_q WHERE NOT ST_IsEmpty(q)) q, unnest(ARRAY[1, 10, 100]) k;
SELECT op, count(*) AS comparisons, count(*) FILTER (WHERE amr_index <> seq) AS index_vs_seq
FROM pg_knn_result GROUP BY op ORDER BY op;
SELECT op, ST_AsText(q), k, left(seq, 80) AS seq, left(amr_index, 80) AS amr_index
FROM pg_knn_result WHERE amr_index <> seq LIMIT 3;

-- after inserts and VACUUM
INSERT INTO pg_amr (g) SELECT ST_MakePoint(random() * 10, random() * 10) FROM generate_series(1, 2000);
DELETE FROM pg_amr WHERE id % 4 = 0;
VACUUM pg_amr;
SELECT amrtree_check('pg_amr_g');
SELECT count(*) AS comparisons,
       count(*) FILTER (WHERE pg_ids('pg_amr', op, q, 'index') <> pg_ids('pg_amr', op, q, 'seq')) AS index_vs_seq
FROM pg_ops, pg_q;
SELECT count(*) FILTER (WHERE pg_knn('pg_amr', '<->', q, 50, 'index') <> pg_knn('pg_amr', '<->', q, 50, 'seq')) AS knn_vs_seq
FROM pg_q WHERE NOT ST_IsEmpty(q);

-- NaN coordinates far from the windows: PostGIS takes a float4 box with a
-- NaN xmin for EMPTY, and EMPTY is "@" every geometry that is not, so
-- POINT(NaN 5) @ a window at y = 1010.  Its key used to keep y = 5 and the
-- index pruned it (the leaf was never read); every operator against
-- windows far from y = 5, before and after inserts
CREATE TABLE pg_nan (id int, g geometry);
INSERT INTO pg_nan SELECT i, ST_MakePoint(i % 100, 1000 + i / 100) FROM generate_series(1, 5000) i;
INSERT INTO pg_nan VALUES (-1, ST_MakePoint('NaN', 5)), (-2, ST_MakePoint(5, 'NaN')),
  (-3, 'LINESTRING(NaN 1, 3 2)');
CREATE INDEX pg_nan_g ON pg_nan USING amrtree (g);
INSERT INTO pg_nan VALUES (-4, ST_MakePoint('NaN', 6)), (-5, 'LINESTRING(NaN 1, NaN 2)');
ANALYZE pg_nan;
SELECT count(*) AS comparisons,
       count(*) FILTER (WHERE pg_ids('pg_nan', op, q, 'index') <> pg_ids('pg_nan', op, q, 'seq')) AS index_vs_seq,
       count(*) FILTER (WHERE pg_ids('pg_nan', op, q, 'bitmap') <> pg_ids('pg_nan', op, q, 'seq')) AS bitmap_vs_seq,
       count(*) FILTER (WHERE -1 = ANY (pg_ids('pg_nan', op, q, 'seq'))) AS nan_rows_in_seq
FROM pg_ops, (VALUES (ST_MakeEnvelope(0, 1010, 0.5, 1010.5)), (ST_MakeEnvelope(20, 1020, 40, 1030)),
              ('POINT(7 1040)'::geometry)) w(q);
SELECT pg_ids('pg_nan', '@', ST_MakeEnvelope(0, 1010, 0.5, 1010.5), 'index') AS contained_by;

-- an exclusion constraint: keys of no subtype, holding a geometry.  Rows
-- of pg_geo in turn into an amrtree constrained table, and into a plain one
-- when a sequential scan finds no row it overlaps: the same ones accepted
-- (GiST's differ: its && on empty, NaN and infinite boxes is its own)
CREATE TABLE pg_ex_amr (id int, g geometry, EXCLUDE USING amrtree (g WITH &&));
CREATE TABLE pg_ex_plain (id int, g geometry);
CREATE FUNCTION pg_ex_fill(tbl text) RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE
  accepted int[] := '{}';
  taken boolean;
BEGIN
  FOR i IN 1 .. 300 LOOP
    IF tbl = 'pg_ex_plain' THEN
      PERFORM set_config('enable_indexscan', 'off', true);
      PERFORM set_config('enable_bitmapscan', 'off', true);
      SELECT EXISTS (SELECT 1 FROM pg_ex_plain p, pg_geo n WHERE n.id = i * 13 AND p.g && n.g) INTO taken;
      IF NOT taken THEN
        INSERT INTO pg_ex_plain SELECT i, g FROM pg_geo WHERE id = i * 13;
        accepted := accepted || i;
      END IF;
      CONTINUE;
    END IF;
    BEGIN
      EXECUTE format('INSERT INTO %I SELECT %s, g FROM pg_geo WHERE id = %s', tbl, i, i * 13);
      accepted := accepted || i;
    EXCEPTION WHEN exclusion_violation THEN NULL;
    END;
  END LOOP;
  PERFORM set_config('enable_indexscan', 'on', true);
  PERFORM set_config('enable_bitmapscan', 'on', true);
  RETURN accepted;
END $$;
SELECT pg_ex_fill('pg_ex_amr') = pg_ex_fill('pg_ex_plain') AS same_accepted,
       (SELECT count(*) FROM pg_ex_amr) < 300 AS some_refused;
DROP TABLE pg_ex_amr, pg_ex_plain;
DROP FUNCTION pg_ex_fill(text);

-- A cached box that is not the box of the coordinates: ST_QuantizeCoordinates
-- keeps the float4 box of the unquantized value, and PostGIS's operators
-- (and its GiST) compare that box.  The key was taken from the coordinates
-- (box(geometry) recomputes it): "&&" at x = 3.299 missed the line (its
-- coordinates end at 3.296875, its box at 3.3000002), "&&" at x = 0.098
-- returned it, "~", "@", "&>" and ">>" lost it, and ORDER BY <#> failed
-- with "index returned tuples in wrong order".  Its box does not cover its
-- coordinates either (x from 0.09765625, the box from 0.099999994), so it
-- is no bound for <->: such a row is decided on the row (GiST's ORDER BY
-- <-> fails here).  Rows before and after the build, points between its
-- two boxes, and such a value as the query.
CREATE TABLE pg_stale (id int, g geometry);
INSERT INTO pg_stale SELECT i, ST_MakePoint(i % 100, 1000 + i / 100) FROM generate_series(1, 3000) i;
INSERT INTO pg_stale VALUES (-10, 'POINT(3.299 1)'), (-11, 'POINT(0.098 1)');
INSERT INTO pg_stale VALUES (-1, ST_QuantizeCoordinates('LINESTRING(0.1 0.2, 1.3 2.7, 3.3 -0.1)', 1)),
  (-2, ST_QuantizeCoordinates('POLYGON((10.1 10.1, 15.7 10.3, 13.1 14.9, 10.1 10.1))', 1));
CREATE INDEX pg_stale_g ON pg_stale USING amrtree (g);
INSERT INTO pg_stale VALUES (-3, ST_QuantizeCoordinates('LINESTRING(20.1 0.2, 21.3 2.7, 23.3 -0.1)', 1)),
  (-4, ST_QuantizeCoordinates('POLYGON((30.1 10.1, 35.7 10.3, 33.1 14.9, 30.1 10.1))', 1));
ANALYZE pg_stale;
SELECT ST_XMin(g) AS xmin, ST_XMax(g) AS xmax, ST_XMin(postgis_getbbox(g))::float4 AS box_xmin,
       ST_XMax(postgis_getbbox(g))::float4 AS box_xmax
FROM pg_stale WHERE id = -1;
CREATE TABLE pg_stale_q AS SELECT * FROM (VALUES
  ('POINT(3.299 1)'::geometry), ('POINT(0.098 1)'), (ST_MakeEnvelope(0.0999, -0.1, 3.3001, 2.71)),
  (ST_MakeEnvelope(15.65, 10, 16, 11)), ('POINT(23.299 1)'), ('POINT(20.098 1)'),
  (ST_MakeEnvelope(20.0999, -0.1, 23.3001, 2.71)), (ST_MakeEnvelope(35.65, 10, 36, 11))) q(q);
SELECT count(*) AS comparisons,
       count(*) FILTER (WHERE pg_ids('pg_stale', op, q, 'index') <> pg_ids('pg_stale', op, q, 'seq')) AS index_vs_seq,
       count(*) FILTER (WHERE pg_ids('pg_stale', op, q, 'bitmap') <> pg_ids('pg_stale', op, q, 'seq')) AS bitmap_vs_seq,
       count(*) FILTER (WHERE -1 = ANY (pg_ids('pg_stale', op, q, 'seq')) OR -3 = ANY (pg_ids('pg_stale', op, q, 'seq'))) AS stale_rows_in_seq
FROM pg_ops, pg_stale_q;
SELECT pg_ids('pg_stale', '&&', 'POINT(3.299 1)', 'index') AS east_of_coordinates,
       pg_ids('pg_stale', '&&', 'POINT(0.098 1)', 'index') AS west_of_box,
       pg_ids('pg_stale', '&&', 'POINT(23.299 1)', 'bitmap') AS inserted;
-- the value as the query: a parameter (pg_ids' literal is parsed again, and
-- its box computed again), whose box PostGIS takes from the cache
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT id FROM pg_stale WHERE g && (SELECT g FROM pg_stale s WHERE s.id = -1);
SELECT array_agg(id ORDER BY id) AS index_scan FROM pg_stale WHERE g && (SELECT g FROM pg_stale s WHERE s.id = -1);
SET enable_seqscan = on;
SET enable_indexscan = off;
SELECT array_agg(id ORDER BY id) AS seq_scan FROM pg_stale WHERE g && (SELECT g FROM pg_stale s WHERE s.id = -1);
RESET enable_seqscan;
RESET enable_indexscan;
RESET enable_bitmapscan;
SELECT op, count(*) AS comparisons,
       count(*) FILTER (WHERE pg_knn('pg_stale', op, q, 5, 'index') <> pg_knn('pg_stale', op, q, 5, 'seq')) AS index_vs_seq
FROM unnest(ARRAY['<->', '<#>']) op,
     (SELECT q FROM pg_stale_q UNION ALL VALUES ('POINT(0 1)'::geometry), ('POINT(20 1)')) q
GROUP BY op ORDER BY op;
SELECT amrtree_check('pg_stale_g');
DROP TABLE pg_stale, pg_stale_q;

-- Coordinates beyond float4's range.  The key is clamped to FLT_MAX there,
-- and PostGIS's <-> is then no longer bounded below by the gap to it: its
-- point-in-polygon test meets inf - inf (or an overflow) on an edge to such
-- a vertex and puts points far outside the polygon inside it, at distance
-- 0.  An ordered scan queued such rows under the gap to their keys (up to
-- 3.4e38), and a LIMIT cut them off: rows missing, no error.  They have the
-- NaN key now (never pruned, distance bound 0, decided on the row); a point
-- at 3e38 keeps an ordinary key.
CREATE TABLE pg_huge (id serial, g geometry);
INSERT INTO pg_huge (g)
SELECT ST_MakePoint(x * 20 + 3, y * 20 + 7) FROM generate_series(0, 49) x, generate_series(0, 49) y;
INSERT INTO pg_huge (id, g) VALUES
  (-1, 'POLYGON((9e137 769,9e137 1e300,1e138 1e300,9e137 769))'),
  (-2, ST_MakePolygon(ST_MakeLine(ARRAY[ST_MakePoint(9e137, 769), ST_MakePoint(9e137, 'Infinity'),
                                        ST_MakePoint(1e138, 'Infinity'), ST_MakePoint(9e137, 769)]))),
  (-3, ST_MakePolygon(ST_MakeLine(ARRAY[ST_MakePoint(500, 557), ST_MakePoint(506.5, 557),
                                        ST_MakePoint(500, 'Infinity'), ST_MakePoint(500, 557)]))),
  (-4, ST_MakePoint(1e39, 5)), (-5, ST_MakePoint(3e38, 5)), (-6, ST_MakePoint('Infinity', 5));
CREATE INDEX pg_huge_g ON pg_huge USING amrtree (g);
SELECT id, amrtree_postgis_bbox(g) AS key FROM pg_huge WHERE id < 0 ORDER BY id DESC;
SELECT id, g <-> 'POINT(311 861)' AS distance FROM pg_huge WHERE id IN (-1, -2, -3) ORDER BY id DESC;
CREATE TABLE pg_huge_q (q geometry);
INSERT INTO pg_huge_q VALUES ('POINT(311 861)'), ('POINT(517.13 773.58)'), ('POINT(250.5 250.5)'),
  ('POINT(1e39 5)'), (ST_MakePoint('Infinity', 259)), ('LINESTRING(0 0,1e300 1)');
SELECT op, count(*) AS comparisons,
       count(*) FILTER (WHERE pg_knn('pg_huge', op, q, k, 'index') <> pg_knn('pg_huge', op, q, k, 'seq')) AS index_vs_seq
FROM unnest(ARRAY['<->', '<#>']) op, pg_huge_q, unnest(ARRAY[1, 3, 20]) k
GROUP BY op ORDER BY op;
SELECT count(*) AS comparisons,
       count(*) FILTER (WHERE pg_ids('pg_huge', op, q, 'index') <> pg_ids('pg_huge', op, q, 'seq')) AS index_vs_seq,
       count(*) FILTER (WHERE pg_ids('pg_huge', op, q, 'bitmap') <> pg_ids('pg_huge', op, q, 'seq')) AS bitmap_vs_seq
FROM pg_ops, (SELECT q FROM pg_huge_q UNION ALL VALUES ('POLYGON((0 0,0 1000,1000 1000,0 0))'::geometry)) q;
SELECT amrtree_check('pg_huge_g');
DROP TABLE pg_huge, pg_huge_q;

DROP TABLE pg_geo, pg_amr, pg_gist, pg_q, pg_ops, pg_result, pg_knn_result, pg_nan;
DROP FUNCTION pg_ids(text, text, geometry, text);
DROP FUNCTION pg_knn(text, text, geometry, int, text);
