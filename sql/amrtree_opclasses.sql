--
-- amrtree_opclasses: point_ops, poly_ops and circle_ops answer every
-- operator exactly as a sequential scan and as GiST do, and KNN (ORDER BY
-- <-> point) on box, point, polygon and circle returns rows in the order a
-- sequential scan's sort does, with NULLs last, as index scans.  Data: the
-- values of PostgreSQL's own regression tables (point_tbl with its NaN and
-- infinite points, polygon_tbl, circle_tbl), duplicates, NULLs, and enough
-- random values for trees of several levels.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS amrtree;
RESET client_min_messages;
SELECT setseed(0.3);

-- every operator class validates
SELECT opcname, amvalidate(oid) FROM pg_opclass
WHERE opcmethod = (SELECT oid FROM pg_am WHERE amname = 'amrtree') ORDER BY opcname;

-- and support functions with the wrong signature are reported: 2 must be
-- box -> T, 3 (box, box) -> float8; there is no 4
CREATE FUNCTION oc_box_to_box(box) RETURNS box LANGUAGE sql IMMUTABLE AS 'SELECT $1';
CREATE FUNCTION oc_box_dist(box) RETURNS float8 LANGUAGE sql IMMUTABLE AS 'SELECT 0::float8';
CREATE OPERATOR CLASS oc_bad_fetch FOR TYPE polygon USING amrtree AS
  OPERATOR 3 && (polygon, polygon), FUNCTION 1 amrtree_poly_bbox(polygon),
  FUNCTION 2 oc_box_to_box(box);
CREATE OPERATOR CLASS oc_bad_distance FOR TYPE polygon USING amrtree AS
  OPERATOR 3 && (polygon, polygon), FUNCTION 1 amrtree_poly_bbox(polygon),
  FUNCTION 3 oc_box_dist(box);
CREATE OPERATOR CLASS oc_bad_number FOR TYPE polygon USING amrtree AS
  OPERATOR 3 && (polygon, polygon), FUNCTION 1 amrtree_poly_bbox(polygon),
  FUNCTION 4 oc_box_to_box(box);
SELECT opcname, amvalidate(oid) FROM pg_opclass WHERE opcname LIKE 'oc_bad%' ORDER BY opcname;
DROP OPERATOR FAMILY oc_bad_fetch USING amrtree;
DROP OPERATOR FAMILY oc_bad_distance USING amrtree;
DROP FUNCTION oc_box_to_box(box), oc_box_dist(box);

-- ---- data ----
CREATE TABLE oc_pt (id serial, v point);
INSERT INTO oc_pt (v) SELECT p FROM unnest(ARRAY['(0.0,0.0)', '(-10.0,0.0)', '(-3.0,4.0)',
  '(5.1, 34.5)', '(-5.0,-12.0)', '(1e-300,-1e-300)', '(1e+300,Inf)', '(Inf,1e+300)',
  '(NaN,NaN)', '(10.0,10.0)', '(NaN,3)', '(3,NaN)']::point[]) p;
INSERT INTO oc_pt (v) VALUES (NULL), (NULL), ('(2,2)'), ('(2,2)'), ('(2,2.0000005)');
INSERT INTO oc_pt (v)
SELECT CASE WHEN i % 97 = 0 THEN NULL ELSE point(round(random() * 400) / 10 - 20, round(random() * 400) / 10 - 20) END
FROM generate_series(1, 6000) i;

CREATE TABLE oc_poly (id serial, v polygon);
INSERT INTO oc_poly (v) VALUES ('(2.0,0.0),(2.0,4.0),(0.0,0.0)'), ('(3.0,1.0),(3.0,3.0),(1.0,0.0)'),
  ('(1,2),(3,4),(5,6),(7,8)'), ('(7,8),(5,6),(3,4),(1,2)'), ('(1,2),(7,8),(5,6),(3,-4)'),
  ('(0.0,0.0)'), ('(0.0,1.0),(0.0,1.0)'), (NULL), (NULL);
INSERT INTO oc_poly (v)
SELECT CASE WHEN i % 101 = 0 THEN NULL
            ELSE polygon(box(point(x, y), point(x + w, y + h))) END
FROM (SELECT i, random() * 40 - 20 x, random() * 40 - 20 y, random() * 2 w, random() * 2 h
      FROM generate_series(1, 3000) i) s;
INSERT INTO oc_poly (v)
SELECT polygon(5, circle(point(random() * 40 - 20, random() * 40 - 20), random() + 0.01))
FROM generate_series(1, 1000);

CREATE TABLE oc_circle (id serial, v circle);
INSERT INTO oc_circle (v) VALUES ('<(5,1),3>'), ('<(1,2),100>'), ('1,3,5'), ('((1,2),3)'),
  ('<(100,200),10>'), ('<(100,1),115>'), ('<(3,5),0>'), ('<(3,5),NaN>'),
  ('<(1e150,1e150),1e150>'), (NULL), (NULL), ('<(2,2),1>'), ('<(2,2),1>');
INSERT INTO oc_circle (v)
SELECT CASE WHEN i % 89 = 0 THEN NULL
            ELSE circle(point(random() * 40 - 20, random() * 40 - 20), random() * 2) END
FROM generate_series(1, 4000) i;

CREATE TABLE oc_box (id serial, v box);
INSERT INTO oc_box (v) VALUES ('(2.0,2.0,0.0,0.0)'), ('(1.0,1.0,3.0,3.0)'), ('((-8, 2), (-2, -10))'),
  ('(2.5, 2.5, 2.5,3.5)'), ('(3.0, 3.0,3.0,3.0)'), ('((NaN,0),(1,1))'), ('((0,0),(1,NaN))'),
  ('((-Infinity,-Infinity),(Infinity,Infinity))'), (NULL), (NULL);
INSERT INTO oc_box (v)
SELECT CASE WHEN i % 93 = 0 THEN NULL ELSE box(point(x, y), point(x + w, y + w)) END
FROM (SELECT i, random() * 40 - 20 x, random() * 40 - 20 y, random() * 0.5 w
      FROM generate_series(1, 6000) i) s;

-- each table with an amrtree index; and its rows without NaN twice more,
-- with amrtree and with GiST.  GiST is held to the sequential scan only
-- without NaN: a NaN coordinate makes the union keys of its inner pages NaN
-- and whole subtrees are skipped (see amrtree_gist_parity).
DO $$
DECLARE t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['oc_pt', 'oc_poly', 'oc_circle', 'oc_box'] LOOP
    EXECUTE format('CREATE TABLE %s_plain AS SELECT * FROM %s WHERE v IS NULL OR v::text NOT LIKE ''%%NaN%%''', t, t);
    EXECUTE format('CREATE TABLE %s_gist AS SELECT * FROM %s_plain', t, t);
    EXECUTE format('CREATE INDEX ON %s USING amrtree (v)', t);
    EXECUTE format('CREATE INDEX ON %s_plain USING amrtree (v)', t);
    EXECUTE format('CREATE INDEX ON %s_gist USING gist (v)', t);
  END LOOP;
END $$;
VACUUM ANALYZE oc_pt, oc_poly, oc_circle, oc_box, oc_pt_plain, oc_poly_plain, oc_circle_plain,
  oc_box_plain, oc_pt_gist, oc_poly_gist, oc_circle_gist, oc_box_gist;

-- ---- search operators ----
CREATE TABLE oc_q (tbl text, op text, q text, qtype text);
-- point_ops: point queries, and <@ box / polygon / circle
INSERT INTO oc_q SELECT 'oc_pt', op, q, 'point'
FROM unnest(ARRAY['<<', '>>', '~=', '<<|', '|>>', '<^', '>^']) op,
     unnest(ARRAY['(0,0)', '(2,2)', '(-3,4)', '(10,10)', '(NaN,NaN)', '(NaN,1)', '(1e300,Inf)',
                  '(5.5,-7.25)', '(2,2.0000005)']) q;
INSERT INTO oc_q SELECT 'oc_pt', '<@', q, 'box'
FROM unnest(ARRAY['(0,0),(10,10)', '(-20,-20),(20,20)', '(2,2),(2,2)', '(1.9999995,1.9999995),(2,2)',
                  '(-Infinity,-Infinity),(Infinity,Infinity)', '(NaN,0),(1,1)', '(-5,-5),(-4,20)']) q;
INSERT INTO oc_q SELECT 'oc_pt', '<@', q, 'polygon'
FROM unnest(ARRAY['(0,0),(10,0),(0,10)', '(-20,-20),(20,-20),(20,20),(-20,20)', '(2,2)',
                  '(1,1),(3,3),(3,1)', '(-10,0),(0,10),(10,0),(0,-10)']) q;
INSERT INTO oc_q SELECT 'oc_pt', '<@', q, 'circle'
FROM unnest(ARRAY['<(0,0),5>', '<(2,2),0>', '<(2,2),0.0000005>', '<(-10,10),3.5>', '<(0,0),NaN>']) q;
-- poly_ops and circle_ops: every box relation
INSERT INTO oc_q SELECT 'oc_poly', op, q, 'polygon'
FROM unnest(ARRAY['<<', '&<', '&&', '&>', '>>', '~=', '@>', '<@', '&<|', '<<|', '|>>', '|&>']) op,
     unnest(ARRAY['(0,0),(10,0),(0,10)', '(2.0,0.0),(2.0,4.0),(0.0,0.0)', '(0.0,0.0)',
                  '(-20,-20),(20,-20),(20,20),(-20,20)', '(1,2),(3,4),(5,6),(7,8)',
                  '(-5,-5),(-4,-5),(-4,-4)']) q;
INSERT INTO oc_q SELECT 'oc_circle', op, q, 'circle'
FROM unnest(ARRAY['<<', '&<', '&&', '&>', '>>', '~=', '@>', '<@', '&<|', '<<|', '|>>', '|&>']) op,
     unnest(ARRAY['<(5,1),3>', '<(0,0),10>', '<(2,2),1>', '<(2,2.0000015),1.0000015>',
                  '<(-10,5),0>', '<(0,0),NaN>', '<(0,0),30>']) q;

-- ids matching "v <op> q" in tbl with only the given scan allowed (the
-- plan is checked, so no comparison passes on two sequential scans)
CREATE FUNCTION oc_ids(tbl text, op text, q text, qtype text, scan text)
RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE
  sql text := format('SELECT id FROM %s WHERE v %s %L::%s', tbl, op, q, qtype);
  plan text := '';
  r record;
  ids int[];
BEGIN
  PERFORM set_config('enable_seqscan', CASE WHEN scan = 'seq' THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_indexscan', CASE WHEN scan = 'index' THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_indexonlyscan', CASE WHEN scan = 'index' THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_bitmapscan', CASE WHEN scan = 'bitmap' THEN 'on' ELSE 'off' END, true);
  FOR r IN EXECUTE 'EXPLAIN (COSTS OFF) ' || sql LOOP
    plan := plan || r."QUERY PLAN" || E'\n';
  END LOOP;
  IF scan = 'index' AND plan NOT LIKE '%Index %Scan using%' OR
     scan = 'bitmap' AND plan NOT LIKE '%Bitmap Index Scan on%' OR
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

CREATE TABLE oc_result AS
SELECT tbl, op, q, qtype,
       oc_ids(tbl, op, q, qtype, 'seq') AS seq,
       oc_ids(tbl, op, q, qtype, 'index') AS amr_index,
       oc_ids(tbl, op, q, qtype, 'bitmap') AS amr_bitmap,
       oc_ids(tbl || '_plain', op, q, qtype, 'index') AS plain_index,
       oc_ids(tbl || '_gist', op, q, qtype, 'index') AS gist_index
FROM oc_q;

SELECT tbl, count(*) AS comparisons,
       count(*) FILTER (WHERE amr_index <> seq) AS index_vs_seq,
       count(*) FILTER (WHERE amr_bitmap <> seq) AS bitmap_vs_seq,
       count(*) FILTER (WHERE plain_index <> gist_index) AS plain_amrtree_vs_gist,
       count(*) FILTER (WHERE cardinality(seq) > 0) AS queries_with_rows
FROM oc_result GROUP BY tbl ORDER BY tbl;
SELECT tbl, op, q, cardinality(seq) AS seq, cardinality(amr_index) AS amr_index,
       cardinality(amr_bitmap) AS amr_bitmap, cardinality(plain_index) AS plain_index,
       cardinality(gist_index) AS gist_index
FROM oc_result
WHERE amr_index <> seq OR amr_bitmap <> seq OR plain_index <> gist_index
LIMIT 5;

-- point_ops is exact (no recheck) and returns points from the index alone;
-- polygons and circles are rechecked
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT v FROM oc_pt WHERE v <@ box '(0,0),(1,1)';
EXPLAIN (COSTS OFF) SELECT v FROM oc_poly WHERE v && polygon '(0,0),(1,1),(1,0)';
SELECT count(*) FROM oc_pt WHERE v <@ box '(0,0),(10,10)';
-- a query that reads no column gets an index-only scan even where the
-- class cannot return one: the column is NULL (it raised "missing support
-- function 2"), and every row is counted
EXPLAIN (COSTS OFF) SELECT count(*) FROM oc_poly;
CREATE TEMP TABLE oc_ios_counts AS
SELECT (SELECT count(*) FROM oc_poly) AS poly, (SELECT count(*) FROM oc_circle) AS circle,
       EXISTS (SELECT 1 FROM oc_circle) AS any_circle;
RESET enable_seqscan;
RESET enable_bitmapscan;
SET enable_indexscan = off;
SET enable_indexonlyscan = off;
SET enable_bitmapscan = off;
SELECT poly = (SELECT count(*) FROM oc_poly) AS poly_counted,
       circle = (SELECT count(*) FROM oc_circle) AS circle_counted, any_circle
FROM oc_ios_counts;
RESET enable_indexscan;
RESET enable_indexonlyscan;
RESET enable_bitmapscan;
DROP TABLE oc_ios_counts;

-- ---- KNN ----
-- The first k rows by "v <-> q" with only the given scan allowed (an
-- index scan must do the ordering itself), as text: the distances in the
-- order returned, and the ids of the rows closer than the last one, sorted
-- (rows tied with the last one may differ between two correct answers).
CREATE FUNCTION oc_knn(tbl text, q point, k int, scan text, filter text DEFAULT 'true')
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  sql text := format('SELECT id, v <-> %L::point AS d FROM %s WHERE %s ORDER BY v <-> %L::point LIMIT %s',
                     q, tbl, filter, q, k);
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
  IF scan = 'index' AND plan NOT LIKE '%Order By: (v <->%' OR
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

CREATE TABLE oc_knn_q (q point);
INSERT INTO oc_knn_q VALUES ('(0,0)'), ('(2,2)'), ('(-19.5,19.5)'), ('(100,100)'), ('(1e300,1e300)'),
  ('(NaN,NaN)'), ('(3,NaN)'), ('(5.25,-3.75)');
CREATE TABLE oc_knn_result AS
SELECT tbl, q, k,
       oc_knn(tbl, q, k, 'seq') AS seq,
       oc_knn(tbl, q, k, 'index') AS amr_index,
       oc_knn(tbl || '_plain', q, k, 'index') AS plain_index,
       -- GiST fails on NaN query points ("inconsistent point values",
       -- "index returned tuples in wrong order")
       CASE WHEN q::text NOT LIKE '%NaN%' THEN oc_knn(tbl || '_gist', q, k, 'index') END AS gist_index
FROM unnest(ARRAY['oc_pt', 'oc_poly', 'oc_circle', 'oc_box']) tbl, oc_knn_q, unnest(ARRAY[1, 10, 100]) k;
SELECT tbl, count(*) AS comparisons,
       count(*) FILTER (WHERE amr_index <> seq) AS index_vs_seq,
       count(gist_index) AS gist_comparisons,
       count(*) FILTER (WHERE plain_index <> gist_index) AS plain_amrtree_vs_gist
FROM oc_knn_result GROUP BY tbl ORDER BY tbl;
SELECT tbl, q, k, left(seq, 60) AS seq, left(amr_index, 60) AS amr_index FROM oc_knn_result
WHERE amr_index <> seq OR plain_index <> gist_index LIMIT 3;

-- every row, NULLs last, and with a search condition too
SELECT tbl,
       oc_knn(tbl, '(1,1)', 100000, 'index') = oc_knn(tbl, '(1,1)', 100000, 'seq') AS all_rows_match,
       oc_knn(tbl, '(1,1)', 50, 'index', 'v IS NULL') = oc_knn(tbl, '(1,1)', 50, 'seq', 'v IS NULL') AS nulls_match
FROM unnest(ARRAY['oc_pt', 'oc_poly', 'oc_circle', 'oc_box']) tbl ORDER BY tbl;
SELECT oc_knn('oc_box', '(1,1)', 30, 'index', 'v && box ''(0,0),(5,5)''') =
       oc_knn('oc_box', '(1,1)', 30, 'seq', 'v && box ''(0,0),(5,5)''') AS filtered_box,
       oc_knn('oc_pt', '(1,1)', 30, 'index', 'v <@ box ''(0,0),(5,5)''') =
       oc_knn('oc_pt', '(1,1)', 30, 'seq', 'v <@ box ''(0,0),(5,5)''') AS filtered_point;

-- the distances an index scan reports are the operator's (box, point:
-- exact; polygon, circle: rechecked by the executor)
SET enable_seqscan = off;
SELECT v <-> point '(1,1)' AS d FROM oc_pt ORDER BY v <-> point '(1,1)' LIMIT 3;
SELECT v <-> point '(1,1)' AS d FROM oc_circle ORDER BY v <-> point '(1,1)' LIMIT 3;
-- an index-only KNN scan of points
EXPLAIN (COSTS OFF) SELECT v FROM oc_pt ORDER BY v <-> point '(1,1)' LIMIT 3;
SELECT v FROM oc_pt ORDER BY v <-> point '(1,1)', v[0] LIMIT 3;
-- nearest-neighbour join: a rescan per outer row
SELECT count(*) AS probes, count(*) FILTER (WHERE n.id IS NOT NULL) AS found
FROM (SELECT point(i, -i) AS p FROM generate_series(-10, 10) i) probes
CROSS JOIN LATERAL (SELECT id FROM oc_pt ORDER BY v <-> probes.p LIMIT 1) n;
-- ORDER BY ... <-> NULL: every distance is NULL
SELECT count(*) FROM (SELECT id FROM oc_pt ORDER BY v <-> NULL::point LIMIT 10) s;
RESET enable_seqscan;

-- Two or three ORDER BY distances: rows tied on the first are sorted by the
-- others in the index, exactly, as GiST does, so an index-only scan works
-- too (the executor cannot reorder its rows).  The distances of the rows
-- returned, in order, by a sequential scan and sort, an index scan and an
-- index-only scan: ties of the first distance abound (grid points, equal
-- points), with NaN and NULL keys, infinities and a NULL or NaN argument.
CREATE FUNCTION oc_knn_multi(tbl text, orderby text, k int, scan text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  sql text := format('SELECT ROW(%s)::text AS d FROM %s ORDER BY %s LIMIT %s', orderby, tbl, orderby, k);
  plan text := '';
  r record;
  result text;
BEGIN
  PERFORM set_config('enable_seqscan', (scan = 'seq')::text, true);
  PERFORM set_config('enable_sort', (scan = 'seq')::text, true);
  PERFORM set_config('enable_indexscan', (scan <> 'seq')::text, true);
  PERFORM set_config('enable_indexonlyscan', (scan = 'index only')::text, true);
  PERFORM set_config('enable_bitmapscan', 'off', true);
  FOR r IN EXECUTE 'EXPLAIN (COSTS OFF) ' || sql LOOP
    plan := plan || r."QUERY PLAN" || E'\n';
  END LOOP;
  IF scan = 'index' AND plan NOT LIKE '%Index Scan using%Order By: (%v <->%' OR
     scan = 'index only' AND plan NOT LIKE '%Index Only Scan using%Order By: (%v <->%' OR
     scan = 'seq' AND plan NOT LIKE '%Seq Scan on%' THEN
    RAISE EXCEPTION 'plan does not use a % scan: %', scan, plan;
  END IF;
  EXECUTE 'SELECT coalesce(array_agg(d ORDER BY n), ''{}'')::text FROM ' ||
          '(SELECT d, row_number() OVER () n FROM (' || sql || ') s) s' INTO result;
  RETURN result;
END $$;
SELECT tbl, orderby, k,
       oc_knn_multi(tbl, orderby, k, 'index') = oc_knn_multi(tbl, orderby, k, 'seq') AS index_scan,
       oc_knn_multi(tbl, orderby, k, 'index only') = oc_knn_multi(tbl, orderby, k, 'seq') AS index_only_scan
FROM (VALUES ('oc_pt', 'v <-> ''(2,2)''::point, v <-> ''(10,-5)''::point', 100000),
             ('oc_pt', 'v <-> ''(0,0)''::point, v <-> ''(1,1)''::point, v <-> ''(-3,4)''::point', 300),
             ('oc_pt', 'v <-> ''(2,2)''::point, v <-> NULL::point', 100000),
             ('oc_pt', 'v <-> ''(2,2)''::point, v <-> ''(NaN,1)''::point', 100000),
             ('oc_pt', 'v <-> ''(NaN,1)''::point, v <-> ''(2,2)''::point', 100000),
             ('oc_box', 'v <-> ''(NaN,NaN)''::point, v <-> ''(1,1)''::point', 100000),
             ('oc_box', 'v <-> ''(1,1)''::point, v <-> ''(30,-7)''::point', 100000),
             ('oc_box', 'v <-> ''(-20,-20)''::point, v <-> ''(0,0)''::point', 50)) q(tbl, orderby, k)
ORDER BY tbl, orderby;
SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT v FROM oc_pt ORDER BY v <-> point '(2,2)', v <-> point '(10,-5)' LIMIT 3;
SELECT v, v <-> point '(10,-5)' AS second FROM oc_pt ORDER BY v <-> point '(2,2)', v <-> point '(10,-5)' LIMIT 3;
-- An ORDER BY whose argument is NULL at run time (a parameter of a generic
-- plan) is NULL for every row: the rows follow the next ORDER BY, as a
-- sort puts them.
SET enable_sort = off;
SET plan_cache_mode = force_generic_plan;
PREPARE oc_knn_param(point, point, int) AS
SELECT n, d FROM (SELECT row_number() OVER () AS n, v <-> $2 AS d
                  FROM (SELECT v FROM oc_pt ORDER BY v <-> $1, v <-> $2 LIMIT $3) s) s;
EXPLAIN (COSTS OFF) EXECUTE oc_knn_param(NULL, '(2,2)', 5);
EXECUTE oc_knn_param(NULL, '(2,2)', 5);
CREATE TEMP TABLE oc_param AS EXECUTE oc_knn_param(NULL, '(2,2)', 100000);
RESET enable_seqscan;
RESET enable_sort;
SELECT (SELECT array_agg(d ORDER BY n) FROM oc_param) =
       (SELECT array_agg(v <-> point '(2,2)' ORDER BY v <-> point '(2,2)') FROM oc_pt) AS null_first_argument;
DEALLOCATE oc_knn_param;
RESET plan_cache_mode;

-- after inserts that split leaves, and VACUUM
INSERT INTO oc_pt (v) SELECT point(random() * 4, random() * 4) FROM generate_series(1, 3000);
DELETE FROM oc_pt WHERE id % 5 = 0;
VACUUM oc_pt;
SELECT amrtree_check(indexrelid) FROM pg_index WHERE indrelid = 'oc_pt'::regclass;
SELECT count(*) AS comparisons,
       count(*) FILTER (WHERE oc_knn('oc_pt', q, 100, 'index') <> oc_knn('oc_pt', q, 100, 'seq')) AS knn_vs_seq
FROM oc_knn_q;
SELECT count(*) AS comparisons,
       count(*) FILTER (WHERE oc_ids(tbl, op, q, qtype, 'index') <> oc_ids(tbl, op, q, qtype, 'seq')) AS index_vs_seq
FROM oc_q WHERE tbl = 'oc_pt';

-- a NULL key takes no place among the scan's keys, so the keys after it
-- shift; the bounding-box function cached for a key's type followed the
-- place, not the key, and a polygon was read as a circle on the next
-- rescan (rows missing, or an overflow error).  Every rescan of the bitmap
-- scan below runs with one element of the array.
SET enable_indexscan = off;
SET enable_bitmapscan = off;
CREATE TEMP TABLE oc_shift AS
SELECT (SELECT count(*) FROM oc_pt WHERE v <@ ANY (ARRAY[NULL, polygon '((0,0),(0,5),(6,5),(6,0))'])
          AND v <@ circle '<(3,2),4>') AS seq;
RESET enable_bitmapscan;
SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT count(*) FROM oc_pt
WHERE v <@ ANY (ARRAY[NULL, polygon '((0,0),(0,5),(6,5),(6,0))']) AND v <@ circle '<(3,2),4>';
SELECT seq > 0 AS found, seq = (SELECT count(*) FROM oc_pt
  WHERE v <@ ANY (ARRAY[NULL, polygon '((0,0),(0,5),(6,5),(6,0))']) AND v <@ circle '<(3,2),4>') AS same
FROM oc_shift;
RESET enable_seqscan;
RESET enable_indexscan;
DROP TABLE oc_shift;
-- a circle whose box is beyond the float8 range: the planner computes the
-- box for its estimate, and an overflow error there failed every plan
SET enable_indexscan = off;
SET enable_bitmapscan = off;
SELECT count(*) > 0 AS answered FROM oc_pt WHERE v <@ circle '<(1e308,0),1e308>';
SELECT count(*) > 0 AS answered FROM oc_circle WHERE v && circle '<(1e308,0),1e308>';
RESET enable_indexscan;
RESET enable_bitmapscan;

-- exclusion constraints on every class: PostgreSQL checks them with scan
-- keys of no subtype, holding a value of the column's type (these were
-- taken for boxes, and points, polygons and circles that conflicted were
-- accepted).  The same values, in the same order, into an amrtree and a
-- GiST constrained table: the same ones accepted, and no conflicting pair.
CREATE FUNCTION ex_fill(tbl text, vals text[]) RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE
  accepted int[] := '{}';
BEGIN
  FOR i IN 1 .. cardinality(vals) LOOP
    BEGIN
      EXECUTE format('INSERT INTO %I VALUES (%s, %L)', tbl, i, vals[i]);
      accepted := accepted || i;
    EXCEPTION WHEN exclusion_violation THEN NULL;
    END;
  END LOOP;
  RETURN accepted;
END $$;
CREATE TABLE ex_vals (cls text, op text, vals text[]);
INSERT INTO ex_vals
SELECT 'point', '~=', array_agg(point(floor(random() * 12), floor(random() * 12))::text) FROM generate_series(1, 300)
UNION ALL
SELECT 'polygon', '&&', array_agg(polygon(box(point(x, y), point(x + random() * 3, y + random() * 3)))::text)
FROM (SELECT random() * 60 x, random() * 60 y FROM generate_series(1, 300)) s
UNION ALL
SELECT 'circle', '&&', array_agg(circle(point(random() * 60, random() * 60), 0.2 + random() * 2)::text)
FROM generate_series(1, 300)
UNION ALL
SELECT 'box', '&&', array_agg(box(point(x, y), point(x + random() * 3, y + random() * 3))::text)
FROM (SELECT random() * 60 x, random() * 60 y FROM generate_series(1, 300)) s;
DO $$
DECLARE r record;
BEGIN
  FOR r IN SELECT * FROM ex_vals LOOP
    EXECUTE format('CREATE TABLE ex_%s_amr (id int, v %s, EXCLUDE USING amrtree (v WITH %s))', r.cls, r.cls, r.op);
    EXECUTE format('CREATE TABLE ex_%s_gist (id int, v %s, EXCLUDE USING gist (v WITH %s))', r.cls, r.cls, r.op);
  END LOOP;
END $$;
CREATE FUNCTION ex_conflicts(tbl text, op text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE n bigint;
BEGIN
  PERFORM set_config('enable_indexscan', 'off', true);
  PERFORM set_config('enable_bitmapscan', 'off', true);
  EXECUTE format('SELECT count(*) FROM %I a JOIN %I b ON a.id < b.id AND a.v %s b.v', tbl, tbl, op) INTO n;
  PERFORM set_config('enable_indexscan', 'on', true);
  PERFORM set_config('enable_bitmapscan', 'on', true);
  RETURN n;
END $$;
SELECT cls, op, amr = gist AS same_accepted, cardinality(amr) < 300 AS some_refused,
       ex_conflicts('ex_' || cls || '_amr', op) AS conflicting_pairs
FROM (SELECT cls, op, ex_fill('ex_' || cls || '_amr', vals) AS amr, ex_fill('ex_' || cls || '_gist', vals) AS gist
      FROM ex_vals) s ORDER BY cls;
DROP TABLE ex_vals, ex_point_amr, ex_point_gist, ex_polygon_amr, ex_polygon_gist,
  ex_circle_amr, ex_circle_gist, ex_box_amr, ex_box_gist;
DROP FUNCTION ex_fill(text, text[]);
DROP FUNCTION ex_conflicts(text, text);

-- a bad operator family: a search operator on a type without a box function
CREATE FUNCTION oc_fake_left(point, lseg) RETURNS bool LANGUAGE sql IMMUTABLE AS 'SELECT true';
CREATE OPERATOR <<< (LEFTARG = point, RIGHTARG = lseg, PROCEDURE = oc_fake_left);
CREATE OPERATOR CLASS oc_bad_ops FOR TYPE point USING amrtree AS
	OPERATOR 1 <<< (point, lseg),
	FUNCTION 1 amrtree_point_bbox(point);
SELECT amvalidate(oid) FROM pg_opclass WHERE opcname = 'oc_bad_ops';
DROP OPERATOR CLASS oc_bad_ops USING amrtree;
DROP OPERATOR FAMILY oc_bad_ops USING amrtree;
DROP OPERATOR <<< (point, lseg);
DROP FUNCTION oc_fake_left(point, lseg);

DROP TABLE oc_pt, oc_poly, oc_circle, oc_box, oc_pt_gist, oc_poly_gist, oc_circle_gist, oc_box_gist,
  oc_pt_plain, oc_poly_plain, oc_circle_plain, oc_box_plain, oc_q, oc_result, oc_knn_q, oc_knn_result;
DROP FUNCTION oc_ids(text, text, text, text, text);
DROP FUNCTION oc_knn(text, point, int, text, text);

-- point_inside() is no box relation: a point with a NaN y is "inside" every
-- polygon with a vertex east of it, wherever the polygon is (and so is a
-- polygon with a NaN vertex for dist_ppoly: distance 0).  Enough rows that
-- those keys sit in leaves of their own, which the inner nodes used to
-- prune (point_ops: rows missing; poly_ops KNN: "index returned tuples in
-- wrong order").
CREATE TABLE oc_nan (id int, p point, pg polygon);
INSERT INTO oc_nan SELECT i, point(i % 100, i / 100),
       polygon(box(point(i % 100, i / 100), point(i % 100 + 0.5, i / 100 + 0.5)))
  FROM generate_series(0, 9999) i;
INSERT INTO oc_nan SELECT 10000 + i, point(-50 - i, 'NaN'), polygon('((-50,0),(-49,NaN),(-48,0))')
  FROM generate_series(0, 199) i;
INSERT INTO oc_nan SELECT 20000 + i, point('NaN', i), NULL FROM generate_series(0, 99) i;
-- and infinities, which meet the query's in inf - inf = NaN
INSERT INTO oc_nan SELECT 30000 + i, point(-60 - i, 'Infinity'), polygon('((200,0),(210,Infinity),(210,0))')
  FROM generate_series(0, 99) i;
CREATE INDEX oc_nan_p ON oc_nan USING amrtree (p);
CREATE INDEX oc_nan_pg ON oc_nan USING amrtree (pg);
CREATE FUNCTION oc_nan_q(q text, how text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE r text;
BEGIN
  PERFORM set_config('enable_seqscan', (how = 'seq')::text, true);
  PERFORM set_config('enable_indexscan', (how = 'index')::text, true);
  PERFORM set_config('enable_bitmapscan', (how = 'index')::text, true);
  BEGIN
    EXECUTE q INTO r;
  EXCEPTION WHEN OTHERS THEN
    r := 'ERROR: ' || SQLERRM;
  END;
  PERFORM set_config('enable_seqscan', 'on', true);
  PERFORM set_config('enable_indexscan', 'on', true);
  PERFORM set_config('enable_bitmapscan', 'on', true);
  RETURN r;
END $$;
SELECT q, oc_nan_q(q, 'index') = oc_nan_q(q, 'seq') AS same, oc_nan_q(q, 'seq') AS seq
FROM unnest(ARRAY[
  $q$SELECT count(*) || ' ' || sum(id) FROM oc_nan WHERE p <@ '((10,10),(10,20),(20,20),(20,10))'::polygon$q$,
  $q$SELECT count(*) || ' ' || sum(id) FROM oc_nan WHERE p <@ '((10,10),(10,Infinity),(20,10))'::polygon$q$,
  $q$SELECT count(*) || ' ' || sum(id) FROM oc_nan WHERE p <@ '((-Infinity,5),(0,6),(1,5))'::polygon$q$,
  $q$SELECT count(*) || ' ' || sum(id) FROM oc_nan WHERE p <@ '((0,0),(10,Infinity),(10,0))'::polygon$q$,
  $q$SELECT array_agg(d)::text FROM (SELECT pg <-> '(-100,500)'::point AS d FROM oc_nan
       ORDER BY pg <-> '(-100,500)'::point LIMIT 5) s$q$,
  $q$SELECT array_agg(d)::text FROM (SELECT pg <-> '(-Infinity,5)'::point AS d FROM oc_nan
       ORDER BY pg <-> '(-Infinity,5)'::point LIMIT 3) s$q$,
  $q$SELECT array_agg(d)::text FROM (SELECT pg <-> '(-5,Infinity)'::point AS d FROM oc_nan
       ORDER BY pg <-> '(-5,Infinity)'::point LIMIT 3) s$q$]) q;
SELECT amrtree_check('oc_nan_p'), amrtree_check('oc_nan_pg');
DROP TABLE oc_nan;
DROP FUNCTION oc_nan_q(text, text);

-- An ordered scan of a lossy class that restarts from the root (an inner
-- node split under it) must not drop entries it never returned: an
-- entry's lower bound can be just below its leaf's (the leaf's box contains
-- the query's x, the entry's box does not), and a restart took every entry
-- closer than the last one returned for returned.  Every box spans y 0..1,
-- just west or east of x = 0; every 7th one straddles it.
CREATE TABLE oc_knn_restart (id int, pg polygon);
INSERT INTO oc_knn_restart
SELECT i, polygon(CASE WHEN i % 7 = 0 THEN box(point(-0.02, 0), point(0.02, 1))
                       WHEN i % 2 = 0 THEN box(point(0.001 + (i % 40) * 0.001, 0), point(0.05, 1))
                       ELSE box(point(-0.05, 0), point(-0.001 - (i % 40) * 0.001, 1)) END)
FROM generate_series(1, 30000) i;
CREATE INDEX oc_knn_restart_pg ON oc_knn_restart USING amrtree (pg);
CREATE FUNCTION oc_knn_restart_run(first int) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  c refcursor;
  r record;
  n int := 0;
  ids int := 0;
  prev float8 := 0;
  ordered bool := true;
BEGIN
  PERFORM set_config('enable_seqscan', 'off', true);
  OPEN c FOR SELECT id, pg <-> '(0,1000000)'::point AS d FROM oc_knn_restart
    ORDER BY pg <-> '(0,1000000)'::point;
  LOOP
    FETCH c INTO r;
    EXIT WHEN NOT FOUND;
    n := n + 1;
    ids := ids + (r.id % 1000);
    ordered := ordered AND r.d >= prev;
    prev := r.d;
    IF n = first THEN
      -- split leaves and inner nodes under the open scan (rows it does not see)
      INSERT INTO oc_knn_restart
      SELECT 100000 + i, polygon(box(point(i, i), point(i + 1, i + 1))) FROM generate_series(1, 20000) i;
    END IF;
  END LOOP;
  CLOSE c;
  DELETE FROM oc_knn_restart WHERE id > 100000;
  PERFORM set_config('enable_seqscan', 'on', true);
  RETURN n || ' rows, id checksum ' || ids || CASE WHEN ordered THEN ', in order' ELSE ', NOT in order' END;
END $$;
SELECT first, oc_knn_restart_run(first) FROM unnest(ARRAY[10, 1000]) first;
SELECT count(*), sum(id % 1000) FROM oc_knn_restart;
SELECT amrtree_check('oc_knn_restart_pg');
DROP TABLE oc_knn_restart;
DROP FUNCTION oc_knn_restart_run(int);

-- ---- rescans free what the bounding-box function allocates ----
-- A nested loop rescans the inner index once per outer row; the query
-- value's box (here polygon -> box) used to be computed in the executor's
-- memory and kept to the end of the query: some 60 bytes a rescan, 30 MB
-- over this join.  The backend's peak resident size (Linux) may now grow
-- by less than 10 MB.
CREATE TABLE oc_rescan (id int, pg polygon);
INSERT INTO oc_rescan SELECT i, polygon(box(point(i, i), point(i + 1, i + 1)))
FROM generate_series(1, 1000) i;
CREATE INDEX oc_rescan_pg ON oc_rescan USING amrtree (pg);
ANALYZE oc_rescan;
SET enable_seqscan = off;
SET enable_bitmapscan = off;
SET enable_hashjoin = off;
SET enable_mergejoin = off;
SET enable_material = off;
EXPLAIN (COSTS OFF) SELECT count(*) FROM generate_series(1, 10) i CROSS JOIN LATERAL
  (SELECT id FROM oc_rescan WHERE pg && polygon(box(point(i, i), point(i + 0.1, i + 0.1)))) s;
SELECT count(*) FROM generate_series(1, 10000) i CROSS JOIN LATERAL	-- warm up
  (SELECT id FROM oc_rescan WHERE pg && polygon(box(point(i % 1000 + 1.5, i % 1000 + 1.5),
                                                 point(i % 1000 + 1.6, i % 1000 + 1.6)))) s;
SELECT (regexp_match(pg_read_file('/proc/self/status'), 'VmHWM:\s+(\d+)'))[1]::bigint AS hwm_kb \gset
SELECT count(*) FROM generate_series(1, 500000) i CROSS JOIN LATERAL
  (SELECT id FROM oc_rescan WHERE pg && polygon(box(point(i % 1000 + 1.5, i % 1000 + 1.5),
                                                 point(i % 1000 + 1.6, i % 1000 + 1.6)))) s;
SELECT (regexp_match(pg_read_file('/proc/self/status'), 'VmHWM:\s+(\d+)'))[1]::bigint - :hwm_kb
  < 10240 AS peak_grew_less_than_10mb;
RESET enable_seqscan;
RESET enable_bitmapscan;
RESET enable_hashjoin;
RESET enable_mergejoin;
RESET enable_material;
DROP TABLE oc_rescan;
