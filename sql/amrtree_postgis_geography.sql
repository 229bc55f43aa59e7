--
-- amrtree_postgis_geography: the geography_ops class (amrtree_postgis 0.2).
-- A geography's key is the longitude/latitude extent of PostGIS's
-- geocentric box (src/amr_geography.c); every answer through the index --
-- &&, the functions PostGIS gives index conditions (ST_DWithin,
-- ST_Intersects, ST_Covers, ST_CoveredBy), and ORDER BY <-> -- is compared
-- with a sequential scan's, over values worldwide: at the poles, on the
-- equator, across the antimeridian, empty and NULL.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS amrtree_postgis CASCADE;
RESET client_min_messages;
SELECT setseed(0.5);

SELECT extversion FROM pg_extension WHERE extname = 'amrtree_postgis';
SELECT amvalidate(c.oid) FROM pg_opclass c JOIN pg_am a ON a.oid = c.opcmethod
WHERE a.amname = 'amrtree' AND c.opcname = 'geography_ops';

CREATE TABLE gg (id serial, g geography);
-- points uniform on the sphere, short lines, small boxes and buffers
INSERT INTO gg (g)
SELECT CASE i % 4
         WHEN 0 THEN ST_MakePoint(lon, lat)::geography
         WHEN 1 THEN ST_MakeLine(ST_MakePoint(lon, lat),
                                 ST_MakePoint(lon + w, least(lat + h, 90)))::geography
         WHEN 2 THEN ST_MakeEnvelope(lon, lat, lon + w, least(lat + h, 90), 4326)::geography
         ELSE ST_Buffer(ST_MakePoint(lon, lat)::geography, w * 20000) END
FROM (SELECT i, random() * 358 - 179 lon, degrees(asin(2 * random() - 1)) lat,
             random() * 0.8 w, random() * 0.8 h
      FROM generate_series(1, 2000) i) s;
-- a dense cluster near the equator (where a projection onto the equatorial
-- plane would lose the latitude) and near the antimeridian
INSERT INTO gg (g)
SELECT ST_MakePoint(lon, lat)::geography
FROM (SELECT random() * 2 - 1 lon, random() * 2 - 1 lat FROM generate_series(1, 200)) s
UNION ALL
SELECT ST_MakePoint(CASE WHEN random() < 0.5 THEN 179.5 + random() * 0.5
                         ELSE -180 + random() * 0.5 END, random() * 10 - 5)::geography
FROM generate_series(1, 200);
INSERT INTO gg (g) VALUES
  ('POINT(0 90)'), ('POINT(45 -90)'), ('POINT(180 0)'), ('POINT(-180 0)'), ('POINT(0 0)'),
  ('POINT(0 0)'), ('POINT EMPTY'), ('LINESTRING EMPTY'), (NULL),
  ('LINESTRING(179.5 10, -179.5 10)'),                    -- across the antimeridian
  ('LINESTRING(0 60, 180 60)'),                           -- over the north pole
  ('LINESTRING(-60 -5, 60 5)'),                           -- long, across the equator
  ('POLYGON((0 80, 120 80, -120 80, 0 80))'),             -- around the north pole
  ('POLYGON((170 -20, -170 -20, -170 -10, 170 -10, 170 -20))'),
  ('POINT(139.69 35.69)'), ('POINT(103.82 1.35)'), ('POINT(-0.13 51.51)');
CREATE INDEX gg_g ON gg USING amrtree (g);
VACUUM ANALYZE gg;

CREATE TABLE gq (q geography);
INSERT INTO gq VALUES
  ('POINT(139.69 35.69)'), ('POINT(103.82 1.35)'), ('POINT(0.2 0.1)'), ('POINT(0 89.9)'),
  ('POINT(180 0)'), ('POINT(-179.9 2)'), ('POINT(45 -90)'),
  ('LINESTRING(179 0, -179 1)'), ('POLYGON((-1 -1, 1 -1, 1 1, -1 1, -1 -1))'),
  ('POLYGON((10 70, 100 70, -170 70, 10 70))'), ('POINT EMPTY');
INSERT INTO gq SELECT ST_MakeEnvelope(lon, lat, lon + 5, lat + 3, 4326)::geography
FROM (SELECT random() * 350 - 175 lon, random() * 160 - 80 lat FROM generate_series(1, 3)) s;

-- the same rows under PostGIS's GiST, for the answers where PostGIS's own
-- index condition and its function disagree (below)
CREATE TABLE gg_gist AS SELECT * FROM gg;
CREATE INDEX gg_gist_g ON gg_gist USING gist (g);
ANALYZE gg_gist;

-- ids of table tbl for which cond holds, with only the given scan allowed;
-- the plan must use tbl's index tbl_g (or no index at all, for 'seq')
CREATE FUNCTION gg_ids(tbl text, cond text, scan text)
RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE
  sql text := format('SELECT id FROM %I WHERE ', tbl) || cond;
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
  IF scan = 'index' AND plan NOT LIKE '%Index Scan using ' || tbl || '_g on%' OR
     scan = 'bitmap' AND plan NOT LIKE '%Bitmap Index Scan on ' || tbl || '_g%' OR
     scan = 'seq' AND plan NOT LIKE '%Seq Scan on%' THEN
    RAISE EXCEPTION 'plan does not use a % scan: %', scan, plan;
  END IF;
  EXECUTE 'SELECT coalesce(array_agg(id ORDER BY id), ''{}'') FROM (' || sql || ') s' INTO ids;
  PERFORM set_config('enable_seqscan', 'on', true);
  PERFORM set_config('enable_indexscan', 'on', true);
  PERFORM set_config('enable_bitmapscan', 'on', true);
  RETURN ids;
END $$;

CREATE TABLE gg_fn (cond text);
INSERT INTO gg_fn VALUES
  ('g && %L'), ('%L && g'), ('ST_Intersects(g, %L)'), ('ST_Intersects(%L, g)'),
  ('ST_Covers(%L, g)'), ('ST_CoveredBy(g, %L)'),
  ('ST_DWithin(g, %L, 0)'), ('ST_DWithin(g, %L, 1000)'), ('ST_DWithin(%L, g, 150000)'),
  ('ST_DWithin(g, %L, 2500000, false)');

-- every condition and query, through a sequential scan, amrtree's index
-- and bitmap scans, and GiST's index scan
CREATE FUNCTION gg_compare()
RETURNS TABLE (cond text, q text, seq int[], amr_index int[], amr_bitmap int[], gist int[])
LANGUAGE sql AS $$
  SELECT cond, q, gg_ids('gg', format(cond, q), 'seq'), gg_ids('gg', format(cond, q), 'index'),
         gg_ids('gg', format(cond, q), 'bitmap'), gg_ids('gg_gist', format(cond, q), 'index')
  FROM (SELECT cond, q::text AS q FROM gg_fn, gq) s
$$;
CREATE TABLE gg_result AS SELECT * FROM gg_compare();

SELECT count(*) AS comparisons,
       count(*) FILTER (WHERE seq <> '{}') AS nonempty,
       sum(cardinality(seq)) AS rows_matched
FROM gg_result;
-- must be empty: amrtree differs from the sequential scan, or from GiST
SELECT cond, ST_AsText(q::geography) AS q, cardinality(seq) AS seq,
       cardinality(amr_index) AS amr_index, cardinality(amr_bitmap) AS amr_bitmap,
       cardinality(gist) AS gist
FROM gg_result WHERE amr_index <> amr_bitmap OR amr_index <> gist OR
  (amr_index <> seq AND cond LIKE '%&&%');
-- PostGIS's own condition: for POINT(180 0), PostGIS's geocentric boxes
-- of POINT(180 0) and POINT(-180 0) do not overlap (sin 180 degrees rounds
-- to +1.2e-16, of -180 to -1.2e-16, and the float4 boxes keep the signs),
-- yet ST_Intersects finds them equal: every index, GiST's too, serves
-- ST_Intersects(g, q) with g && q and misses the other one
SELECT cond, ST_AsText(q::geography) AS q, ARRAY(SELECT ST_AsText(g) FROM gg
         WHERE id = ANY (seq) AND id <> ALL (amr_index) ORDER BY id) AS only_seq
FROM gg_result WHERE amr_index <> seq ORDER BY cond;

-- the plans: index conditions from PostGIS's support function
EXPLAIN (COSTS OFF)
SELECT id FROM gg WHERE ST_DWithin(g, 'POINT(139.69 35.69)'::geography, 1000);
EXPLAIN (COSTS OFF)
SELECT id FROM gg WHERE ST_Intersects(g, 'POLYGON((-1 -1, 1 -1, 1 1, -1 1, -1 -1))'::geography);

-- the keys: longitudes and latitudes, whole longitudes across the
-- antimeridian and around the pole, NaN for an empty value
SELECT ST_AsText(g) AS g, key FROM gg JOIN amrtree_leaf_entries('gg_g') e ON e.tid = gg.ctid
WHERE gg.id > 2400 ORDER BY gg.id;

-- ORDER BY <->: the index gives the distances a sort does, in order; rows
-- tied at the last distance may differ
CREATE FUNCTION gg_knn(q geography, k int, scan text)
RETURNS TABLE (ids int[], dists float8[]) LANGUAGE plpgsql AS $$
DECLARE
  plan text := '';
  r record;
BEGIN
  PERFORM set_config('enable_seqscan', CASE WHEN scan = 'seq' THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_indexscan', CASE WHEN scan = 'index' THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_bitmapscan', 'off', true);
  FOR r IN EXECUTE format('EXPLAIN (COSTS OFF) SELECT id FROM gg ORDER BY g <-> %L LIMIT %s', q, k) LOOP
    plan := plan || r."QUERY PLAN" || E'\n';
  END LOOP;
  IF scan = 'index' AND plan NOT LIKE '%Index Scan using gg_g%' OR
     scan = 'seq' AND plan LIKE '%Index%' THEN
    RAISE EXCEPTION 'plan does not use a % scan: %', scan, plan;
  END IF;
  RETURN QUERY EXECUTE format(
    'SELECT array_agg(id ORDER BY n), array_agg(d ORDER BY n) FROM
       (SELECT id, g <-> %L AS d, row_number() OVER () AS n FROM
          (SELECT id, g FROM gg ORDER BY g <-> %L LIMIT %s) s) t', q, q, k);
  PERFORM set_config('enable_seqscan', 'on', true);
  PERFORM set_config('enable_indexscan', 'on', true);
  PERFORM set_config('enable_bitmapscan', 'on', true);
END $$;

CREATE TABLE gg_knn_result AS
SELECT q, k, i.ids AS amr_ids, i.dists AS amr_dists, s.ids AS seq_ids, s.dists AS seq_dists
FROM (SELECT q::text AS q FROM gq WHERE NOT ST_IsEmpty(q::geometry)) qs,
     (VALUES (1), (10), (60)) ks (k),
     LATERAL gg_knn(q::geography, k, 'index') i,
     LATERAL gg_knn(q::geography, k, 'seq') s;
SELECT count(*) AS knn_comparisons FROM gg_knn_result;
-- must be empty: the same distances, and the same rows below the last one
SELECT ST_AsText(q::geography) AS q, k, amr_dists, seq_dists FROM gg_knn_result
WHERE amr_dists IS DISTINCT FROM seq_dists
   OR (SELECT array_agg(a ORDER BY a) FROM unnest(amr_ids, amr_dists) u (a, d)
       WHERE d < amr_dists[k]) IS DISTINCT FROM
      (SELECT array_agg(a ORDER BY a) FROM unnest(seq_ids, seq_dists) u (a, d)
       WHERE d < seq_dists[k]);
-- the bound itself (support function 3): never above <->, close to it
-- for nearby values, and never larger for a box than for a box inside it
CREATE TABLE gg_pairs AS
SELECT a.g <-> b.g AS exact,
       amrtree_geography_distance(amrtree_geography_bbox(a.g), amrtree_geography_bbox(b.g)) AS bound,
       amrtree_geography_distance(box(point((ka[1])[0] - 0.5, (ka[1])[1] - 0.5),
                                      point((ka[0])[0] + 0.5, (ka[0])[1] + 0.5)),
                                  amrtree_geography_bbox(b.g)) AS wider_bound,
       GeometryType(a.g) = 'POINT' AND GeometryType(b.g) = 'POINT' AS points
FROM (SELECT g, amrtree_geography_bbox(g) AS ka FROM gg WHERE id % 20 = 0 OR id > 2400) a,
     (SELECT g FROM gg WHERE id % 97 = 0 OR id > 2400 UNION ALL SELECT q FROM gq) b
WHERE NOT ST_IsEmpty(a.g::geometry) AND NOT ST_IsEmpty(b.g::geometry);
SELECT count(*) AS pairs, count(*) FILTER (WHERE bound > exact) AS above,
       count(*) FILTER (WHERE wider_bound > bound) AS not_monotone,
       round(min(bound / exact) FILTER (WHERE points AND exact BETWEEN 1000 AND 1000000)::numeric, 3)
         AS tightness_points
FROM gg_pairs;
EXPLAIN (COSTS OFF)
SELECT id FROM gg ORDER BY g <-> 'POINT(139.69 35.69)'::geography LIMIT 5;
-- all of it, NULL and empty values last
SET enable_seqscan = off;
SELECT count(*) AS rows, count(d) AS with_distance,
       bool_and(d >= coalesce(prev, 0)) AS ascending
FROM (SELECT d, lag(d) OVER (ORDER BY n) AS prev FROM
        (SELECT g <-> 'POINT(10 10)'::geography AS d, row_number() OVER () AS n
         FROM (SELECT g FROM gg ORDER BY g <-> 'POINT(10 10)'::geography) s) t) u;
RESET enable_seqscan;

-- a nested-loop join on ST_DWithin, with the index on the inner side
CREATE TABLE gg_probe AS SELECT id AS pid, g AS p FROM gg WHERE id % 50 = 0;
ANALYZE gg_probe;
SET enable_hashjoin = off;
SET enable_mergejoin = off;
SET enable_seqscan = off;
EXPLAIN (COSTS OFF)
SELECT pid, id FROM gg_probe JOIN gg ON ST_DWithin(g, p, 50000);
CREATE TABLE gg_join_index AS SELECT pid, id FROM gg_probe JOIN gg ON ST_DWithin(g, p, 50000);
RESET enable_seqscan;
SET enable_indexscan = off;
SET enable_bitmapscan = off;
CREATE TABLE gg_join_seq AS SELECT pid, id FROM gg_probe JOIN gg ON ST_DWithin(g, p, 50000);
RESET enable_indexscan;
RESET enable_bitmapscan;
RESET enable_hashjoin;
RESET enable_mergejoin;
SELECT (SELECT count(*) FROM gg_join_index) AS pairs,
       (SELECT md5(string_agg(pid || ':' || id, ',' ORDER BY pid, id)) FROM gg_join_index) =
       (SELECT md5(string_agg(pid || ':' || id, ',' ORDER BY pid, id)) FROM gg_join_seq) AS same;

-- writes after the build, the same on both tables: inserts (splits),
-- deletes, VACUUM
INSERT INTO gg (g)
SELECT ST_MakePoint(random() * 4 - 2, random() * 4 - 2)::geography FROM generate_series(1, 1500);
INSERT INTO gg_gist SELECT * FROM gg WHERE id > (SELECT max(id) FROM gg_gist);
DELETE FROM gg WHERE id % 3 = 0;
DELETE FROM gg_gist WHERE id % 3 = 0;
VACUUM gg;
VACUUM gg_gist;
SELECT amrtree_check('gg_g');
DELETE FROM gg_fn WHERE cond NOT IN ('g && %L', 'ST_Intersects(g, %L)', 'ST_DWithin(g, %L, 1000)',
                                      'ST_DWithin(%L, g, 150000)');
CREATE TABLE gg_result2 AS SELECT * FROM gg_compare();
SELECT count(*) AS comparisons, sum(cardinality(seq)) AS rows_matched FROM gg_result2;
-- must be empty
SELECT cond, ST_AsText(q::geography) AS q FROM gg_result2
WHERE amr_index <> amr_bitmap OR amr_index <> gist OR (amr_index <> seq AND cond LIKE '%&&%');

-- the update path from 0.1: drop the extension (and with it the amrtree
-- indexes on geometry and geography, this test's and the earlier ones'),
-- install 0.1, which has no class for geography, and update
SET client_min_messages = warning;
DROP EXTENSION amrtree_postgis CASCADE;
CREATE EXTENSION amrtree_postgis VERSION '0.1';
RESET client_min_messages;
CREATE INDEX gg_g ON gg USING amrtree (g);
ALTER EXTENSION amrtree_postgis UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'amrtree_postgis';
CREATE INDEX gg_g ON gg USING amrtree (g);
SET enable_seqscan = off;
SET enable_bitmapscan = off;
SELECT count(*) FROM gg WHERE ST_DWithin(g, 'POINT(0.2 0.1)', 50000);
RESET enable_seqscan;
RESET enable_bitmapscan;
SELECT count(*) FROM gg WHERE ST_DWithin(g, 'POINT(0.2 0.1)', 50000);
