--
-- amrtree_postgis_support: PostGIS's functions that a GiST index serves
-- without a written && (ST_Intersects, ST_DWithin, ST_Contains, ...) are
-- served by an amrtree index too.  PostGIS's planner support function gives
-- index conditions only to GiST, SP-GiST and BRIN families; amrtree plans
-- them under gist_geometry_ops_2d, whose operators its geometry_ops_2d has
-- under the same numbers (src/amr_plan.c).  Every answer through the index
-- is compared with a sequential scan's, and every plan is checked to use
-- the amrtree index with the condition PostGIS derives.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS amrtree_postgis CASCADE;
RESET client_min_messages;
SELECT setseed(0.25);

CREATE TABLE sf_geo (id serial, g geometry);
INSERT INTO sf_geo (g)
SELECT CASE i % 4
         WHEN 0 THEN ST_MakePoint(x, y)
         WHEN 1 THEN ST_MakeLine(ST_MakePoint(x, y), ST_MakePoint(x + w, y + h))
         WHEN 2 THEN ST_MakeEnvelope(x, y, x + w, y + h)
         ELSE ST_Buffer(ST_MakePoint(x, y), w, 2) END
FROM (SELECT i, random() * 200 - 100 x, random() * 100 - 50 y, random() * 3 w, random() * 3 h
      FROM generate_series(1, 4000) i) s;
INSERT INTO sf_geo (g) VALUES ('POINT(0 0)'), ('POINT(0 0)'), ('POINT EMPTY'), (NULL),
  ('POLYGON((0 0, 4 0, 4 4, 0 4, 0 0))'), ('LINESTRING(-2 2, 6 2)'), ('POINT(2 2)');
CREATE INDEX sf_geo_g ON sf_geo USING amrtree (g);
VACUUM ANALYZE sf_geo;

CREATE TABLE sf_q (q geometry);
INSERT INTO sf_q VALUES ('POINT(0 0)'), ('POINT(2 2)'), ('POLYGON((0 0, 4 0, 4 4, 0 4, 0 0))'),
  ('LINESTRING(-50 -20, 50 20)'), ('POLYGON((-1 -1, 5 -1, 5 5, -1 5, -1 -1))'), ('POINT EMPTY');
INSERT INTO sf_q SELECT ST_MakeEnvelope(x, y, x + 10, y + 5)
FROM (SELECT random() * 200 - 100 x, random() * 100 - 50 y FROM generate_series(1, 4)) s;

-- ids for which "fn(args)" holds, with only the given scan allowed; the
-- plan must use sf_geo_g (or no index at all, for 'seq')
CREATE FUNCTION sf_ids(cond text, scan text)
RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE
  sql text := 'SELECT id FROM sf_geo WHERE ' || cond;
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
  IF scan = 'index' AND plan NOT LIKE '%Index Scan using sf_geo_g%' OR
     scan = 'bitmap' AND plan NOT LIKE '%Bitmap Index Scan on sf_geo_g%' OR
     scan = 'seq' AND plan NOT LIKE '%Seq Scan on%' THEN
    RAISE EXCEPTION 'plan does not use a % scan: %', scan, plan;
  END IF;
  EXECUTE 'SELECT coalesce(array_agg(id ORDER BY id), ''{}'') FROM (' || sql || ') s' INTO ids;
  PERFORM set_config('enable_seqscan', 'on', true);
  PERFORM set_config('enable_indexscan', 'on', true);
  PERFORM set_config('enable_bitmapscan', 'on', true);
  RETURN ids;
END $$;

-- the functions PostGIS gives index conditions (indexed column first and
-- second), with a distance where they take one
CREATE TABLE sf_fn (cond text);
INSERT INTO sf_fn VALUES
  ('ST_Intersects(g, %L)'), ('ST_Intersects(%L, g)'), ('ST_Contains(g, %L)'), ('ST_Contains(%L, g)'),
  ('ST_ContainsProperly(%L, g)'), ('ST_Within(g, %L)'), ('ST_Within(%L, g)'), ('ST_Covers(%L, g)'),
  ('ST_CoveredBy(g, %L)'), ('ST_Touches(g, %L)'), ('ST_Crosses(g, %L)'), ('ST_Overlaps(g, %L)'),
  ('ST_Equals(g, %L)'), ('ST_OrderingEquals(g, %L)'), ('ST_3DIntersects(g, %L)'),
  ('ST_DWithin(g, %L, 1.5)'), ('ST_DWithin(%L, g, 0)'), ('ST_DFullyWithin(g, %L, 8)'),
  ('ST_3DDWithin(g, %L, 2)');

SET client_min_messages = warning;	-- the 3-D functions' notices on 2-D rows
CREATE TABLE sf_result AS
SELECT cond, q, sf_ids(format(cond, q), 'seq') AS seq,
       sf_ids(format(cond, q), 'index') AS amr_index,
       sf_ids(format(cond, q), 'bitmap') AS amr_bitmap
FROM (SELECT cond, q::text AS q FROM sf_fn, sf_q) s;
RESET client_min_messages;
SELECT count(*) AS comparisons,
       count(*) FILTER (WHERE amr_index <> seq) AS index_vs_seq,
       count(*) FILTER (WHERE amr_bitmap <> seq) AS bitmap_vs_seq,
       count(*) FILTER (WHERE cardinality(seq) > 0) AS queries_with_rows
FROM sf_result;
SELECT cond, left(ST_AsText(q::geometry), 40) AS q, cardinality(seq) AS seq,
       cardinality(amr_index) AS amr_index, cardinality(amr_bitmap) AS amr_bitmap
FROM sf_result WHERE amr_index <> seq OR amr_bitmap <> seq LIMIT 5;

-- with default settings, a small window is planned on the index, with the
-- condition PostGIS derives and the function as the recheck
EXPLAIN (COSTS OFF)
SELECT id FROM sf_geo WHERE ST_Intersects(g, 'POLYGON((0 0, 1 0, 1 1, 0 1, 0 0))');
EXPLAIN (COSTS OFF)
SELECT id FROM sf_geo WHERE ST_DWithin('POINT(3 3)', g, 0.5);
EXPLAIN (COSTS OFF)
SELECT id FROM sf_geo WHERE ST_Contains(g, 'POINT(2 2)');

-- an OR of calls: a BitmapOr of two index scans, as GiST gets
EXPLAIN (COSTS OFF)
SELECT id FROM sf_geo WHERE ST_Intersects(g, 'POINT(2 2)') OR ST_DWithin(g, 'POINT(50 20)', 1);
SELECT sf_ids('ST_Intersects(g, ''POINT(2 2)'') OR ST_DWithin(g, ''POINT(50 20)'', 1)', 'bitmap') =
       sf_ids('ST_Intersects(g, ''POINT(2 2)'') OR ST_DWithin(g, ''POINT(50 20)'', 1)', 'seq')
  AS or_agrees,
       cardinality(sf_ids('ST_Intersects(g, ''POINT(2 2)'') OR ST_DWithin(g, ''POINT(50 20)'', 1)', 'seq'))
  AS or_rows;

-- joins: each probe rescans the index (a parameterized path), as with GiST
CREATE TABLE sf_probe (pid int, p geometry);
INSERT INTO sf_probe SELECT i, ST_MakePoint(random() * 200 - 100, random() * 100 - 50)
FROM generate_series(1, 300) i;
ANALYZE sf_probe;
EXPLAIN (COSTS OFF)
SELECT count(*) FROM sf_probe JOIN sf_geo ON ST_DWithin(g, p, 1);
EXPLAIN (COSTS OFF)
SELECT count(*) FROM sf_probe JOIN sf_geo ON ST_Contains(g, p);
CREATE FUNCTION sf_join(cond text)
RETURNS TABLE (joined bigint, nested_loop_on_index boolean, same_as_seq boolean)
LANGUAGE plpgsql AS $$
DECLARE
  sql text := 'SELECT pid, id FROM sf_probe JOIN sf_geo ON ' || cond;
  plan text := '';
  r record;
  by_index text;
  by_seq text;
BEGIN
  FOR r IN EXECUTE 'EXPLAIN (COSTS OFF) ' || sql LOOP
    plan := plan || r."QUERY PLAN" || E'\n';
  END LOOP;
  EXECUTE 'SELECT count(*), md5(string_agg(pid || '' '' || id, '','' ORDER BY pid, id)) FROM ('
          || sql || ') s' INTO joined, by_index;
  PERFORM set_config('enable_indexscan', 'off', true);
  PERFORM set_config('enable_bitmapscan', 'off', true);
  EXECUTE 'SELECT md5(string_agg(pid || '' '' || id, '','' ORDER BY pid, id)) FROM ('
          || sql || ') s' INTO by_seq;
  PERFORM set_config('enable_indexscan', 'on', true);
  PERFORM set_config('enable_bitmapscan', 'on', true);
  nested_loop_on_index := plan LIKE '%Nested Loop%' AND plan LIKE '%sf_geo_g%';
  same_as_seq := by_index = by_seq;
  RETURN NEXT;
END $$;
SELECT c, j.* FROM unnest(ARRAY['ST_DWithin(g, p, 1)', 'ST_DWithin(p, g, 2.5)', 'ST_Intersects(g, ST_Buffer(p, 1))',
  'ST_Contains(g, p)', 'ST_Within(p, g)']) c, sf_join(c) j;

-- partitions: each partition's index is used
CREATE TABLE sf_part (id int, g geometry) PARTITION BY RANGE (id);
CREATE TABLE sf_part_1 PARTITION OF sf_part FOR VALUES FROM (0) TO (3000);
CREATE TABLE sf_part_2 PARTITION OF sf_part FOR VALUES FROM (3000) TO (10000);
INSERT INTO sf_part SELECT id, g FROM sf_geo;
CREATE INDEX ON sf_part USING amrtree (g);
VACUUM ANALYZE sf_part;
SET max_parallel_workers_per_gather = 0;
EXPLAIN (COSTS OFF)
SELECT count(*) FROM sf_part WHERE ST_Intersects(g, 'POLYGON((0 0, 1 0, 1 1, 0 1, 0 0))');
SELECT (SELECT count(*) FROM sf_part WHERE ST_Intersects(g, 'POLYGON((-10 -10, 10 -10, 10 10, -10 10, -10 -10))')) =
       (SELECT count(*) FROM sf_geo WHERE ST_Intersects(g, 'POLYGON((-10 -10, 10 -10, 10 10, -10 10, -10 -10))'))
  AS partitions_agree;
RESET max_parallel_workers_per_gather;

-- only a family with exactly GiST's operators is planned under GiST's:
-- one with && alone gets no index condition from ST_Intersects (its &&
-- still uses the index); a copy of geometry_ops_2d does, until an operator
-- is added to it, and again once the operator is gone
CREATE OPERATOR CLASS sf_overlap_only FOR TYPE geometry USING amrtree AS
  OPERATOR 3 && (geometry, geometry),
  FUNCTION 1 amrtree_postgis_bbox(geometry);
CREATE OPERATOR CLASS sf_copy_ops FOR TYPE geometry USING amrtree AS
  OPERATOR 1 <<, OPERATOR 2 &<, OPERATOR 3 &&, OPERATOR 4 &>, OPERATOR 5 >>, OPERATOR 6 ~=,
  OPERATOR 7 ~, OPERATOR 8 @, OPERATOR 9 &<|, OPERATOR 10 <<|, OPERATOR 11 |>>, OPERATOR 12 |&>,
  OPERATOR 13 <-> (geometry, geometry) FOR ORDER BY float_ops,
  OPERATOR 14 <#> (geometry, geometry) FOR ORDER BY float_ops,
  FUNCTION 1 amrtree_postgis_bbox(geometry);
CREATE TABLE sf_small (id int, g geometry);
INSERT INTO sf_small SELECT id, g FROM sf_geo;
CREATE INDEX sf_small_g ON sf_small USING amrtree (g sf_overlap_only);
CREATE TABLE sf_copy (id int, g geometry);
INSERT INTO sf_copy SELECT id, g FROM sf_geo;
CREATE INDEX sf_copy_g ON sf_copy USING amrtree (g sf_copy_ops);
VACUUM ANALYZE sf_small;
VACUUM ANALYZE sf_copy;
SET enable_seqscan = off;
EXPLAIN (COSTS OFF)
SELECT id FROM sf_small WHERE ST_Intersects(g, 'POINT(1 1)');
EXPLAIN (COSTS OFF)
SELECT id FROM sf_small WHERE g && 'POINT(1 1)'::geometry;
EXPLAIN (COSTS OFF)
SELECT id FROM sf_copy WHERE ST_Intersects(g, 'POINT(1 1)');
ALTER OPERATOR FAMILY sf_copy_ops USING amrtree ADD OPERATOR 15 = (geometry, geometry);
EXPLAIN (COSTS OFF)
SELECT id FROM sf_copy WHERE ST_Intersects(g, 'POINT(1 1)');
ALTER OPERATOR FAMILY sf_copy_ops USING amrtree DROP OPERATOR 15 (geometry, geometry);
EXPLAIN (COSTS OFF)
SELECT id FROM sf_copy WHERE ST_Intersects(g, 'POINT(1 1)');
RESET enable_seqscan;

DROP TABLE sf_geo, sf_q, sf_fn, sf_result, sf_probe, sf_part, sf_small, sf_copy;
DROP OPERATOR CLASS sf_overlap_only USING amrtree;
DROP OPERATOR FAMILY sf_overlap_only USING amrtree;
DROP OPERATOR CLASS sf_copy_ops USING amrtree;
DROP OPERATOR FAMILY sf_copy_ops USING amrtree;
DROP FUNCTION sf_ids(text, text), sf_join(text);
