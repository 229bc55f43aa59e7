--
-- amrtree_parity: for every strategy, the index returns exactly the rows a
-- sequential scan returns (same rows, not just counts), on data with
-- duplicates, points, NULLs, huge and infinite boxes; through index scans,
-- bitmap scans and index-only scans; after DELETE + VACUUM + INSERT and
-- after REINDEX; and amrtree_check holds after each phase.
--
SELECT setseed(0.42);

CREATE TABLE pt (id int PRIMARY KEY, b box);
INSERT INTO pt
SELECT i,
       CASE
         WHEN i % 97 = 0 THEN NULL
         WHEN i % 31 = 0 THEN box(point(x, y), point(x, y))                  -- points
         WHEN i % 53 = 0 THEN box '((0.25,0.25),(0.2500004,0.26))'         -- duplicates
         WHEN i % 211 = 0 THEN box(point(-1e300, y), point(1e300, y + 0.1)) -- huge
         WHEN i % 401 = 0 THEN box(point('-infinity', y), point(x, 'infinity')) -- infinite
         ELSE box(point(x, y), point(x + w, y + h))
       END
FROM (SELECT i, random() x, random() y, random() * 0.02 w, random() * 0.02 h
      FROM generate_series(1, 30000) i) s;
CREATE INDEX pt_b ON pt USING amrtree (b);
VACUUM ANALYZE pt;

-- query windows: small, large, exact duplicates (and within EPSILON of
-- them), a point, everything, nothing, a strip, infinite, and random ones
CREATE TABLE q (qid int, qb box);
INSERT INTO q VALUES
  (1, '((0.5,0.5),(0.52,0.52))'),
  (2, '((0,0),(1,1))'),
  (3, '((0.25,0.25),(0.2500004,0.26))'),
  (4, '((0.2500009,0.25),(0.25,0.2600005))'),
  (5, '((0.1,0.9),(0.1,0.9))'),
  (6, '((-infinity,-infinity),(infinity,infinity))'),
  (7, '((2,2),(3,3))'),
  (8, '((0.3,0),(0.31,1))'),
  (9, '((-infinity,0.4),(0.6,infinity))'),
  (10, '((-1e300,0),(1e300,0.5))');
INSERT INTO q SELECT 10 + i, box(point(x, y), point(x + w, y + w * 2))
FROM (SELECT i, random() x, random() y, random() * 0.1 w FROM generate_series(1, 15) i) s;

CREATE TABLE ops (op text);
INSERT INTO ops VALUES ('<<'), ('&<'), ('&&'), ('&>'), ('>>'), ('~='),
                       ('@>'), ('<@'), ('&<|'), ('<<|'), ('|>>'), ('|&>');

-- Row ids matching "b <op> q" with only the given scan type allowed.  The
-- plan is checked to really use the scan type under test, so a comparison
-- can never pass vacuously on two sequential scans.
CREATE FUNCTION amr_ids(tbl regclass, op text, qb box, scan text)
RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE
  sql text := format('SELECT id FROM %s WHERE b %s %L::box', tbl, op, qb);
  plan text := '';
  r record;
  ids int[];
BEGIN
  PERFORM set_config('enable_seqscan', CASE WHEN scan = 'seq' THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_indexscan', CASE WHEN scan = 'index' THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_bitmapscan', CASE WHEN scan = 'bitmap' THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_indexonlyscan', 'off', true);
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
  PERFORM set_config('enable_indexonlyscan', 'on', true);
  RETURN ids;
END $$;

-- Index-only scans return the stored boxes: compare them as text.
CREATE FUNCTION amr_ios_boxes(tbl regclass, op text, qb box, ios bool)
RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE
  sql text := format('SELECT b FROM %s WHERE b %s %L::box', tbl, op, qb);
  plan text := '';
  r record;
  res text[];
BEGIN
  PERFORM set_config('enable_seqscan', CASE WHEN ios THEN 'off' ELSE 'on' END, true);
  PERFORM set_config('enable_indexscan', CASE WHEN ios THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_bitmapscan', 'off', true);
  FOR r IN EXECUTE 'EXPLAIN (COSTS OFF) ' || sql LOOP
    plan := plan || r."QUERY PLAN" || E'\n';
  END LOOP;
  IF ios AND plan NOT LIKE '%Index Only Scan using%' THEN
    RAISE EXCEPTION 'plan is not an index-only scan: %', plan;
  END IF;
  EXECUTE 'SELECT coalesce(array_agg(b::text ORDER BY b::text), ''{}'') FROM (' || sql || ') s' INTO res;
  PERFORM set_config('enable_seqscan', 'on', true);
  PERFORM set_config('enable_indexscan', 'on', true);
  PERFORM set_config('enable_bitmapscan', 'on', true);
  RETURN res;
END $$;

-- One line per strategy: how many (query, scan type) pairs disagree with
-- the sequential scan, and how many rows the strategy matched in total.
CREATE FUNCTION amr_parity(tbl regclass)
RETURNS TABLE (op text, mismatches bigint, rows_matched bigint)
LANGUAGE sql AS $$
  WITH r AS (
    SELECT o.op, q.qid,
           amr_ids(tbl, o.op, q.qb, 'seq') AS seq,
           amr_ids(tbl, o.op, q.qb, 'index') AS idx,
           amr_ids(tbl, o.op, q.qb, 'bitmap') AS bmp,
           amr_ios_boxes(tbl, o.op, q.qb, true) AS ios,
           amr_ios_boxes(tbl, o.op, q.qb, false) AS ios_seq
    FROM ops o, q)
  SELECT op,
         count(*) FILTER (WHERE seq <> idx) + count(*) FILTER (WHERE seq <> bmp)
           + count(*) FILTER (WHERE ios <> ios_seq),
         sum(cardinality(seq))
  FROM r GROUP BY op ORDER BY min(CASE op WHEN '<<' THEN 1 WHEN '&<' THEN 2 WHEN '&&' THEN 3
    WHEN '&>' THEN 4 WHEN '>>' THEN 5 WHEN '~=' THEN 6 WHEN '@>' THEN 7 WHEN '<@' THEN 8
    WHEN '&<|' THEN 9 WHEN '<<|' THEN 10 WHEN '|>>' THEN 11 ELSE 12 END)
$$;

-- the scan types exist for this index
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT id FROM pt WHERE b && '((0.5,0.5),(0.52,0.52))';
EXPLAIN (COSTS OFF) SELECT b FROM pt WHERE b && '((0.5,0.5),(0.52,0.52))';
RESET enable_bitmapscan;
SET enable_indexscan = off;
EXPLAIN (COSTS OFF) SELECT id FROM pt WHERE b && '((0.5,0.5),(0.52,0.52))';
RESET enable_indexscan;
RESET enable_seqscan;

-- phase 1: bulk-built index
SELECT * FROM amr_parity('pt');
SELECT amrtree_check('pt_b');

-- NULL searches and a full index-only scan
SET enable_seqscan = off;
SELECT count(*) FROM pt WHERE b IS NULL;
SELECT count(*) FROM pt WHERE b IS NOT NULL;
EXPLAIN (COSTS OFF) SELECT count(*) FROM pt;
SELECT count(*) FROM pt;
RESET enable_seqscan;
SELECT count(*) FILTER (WHERE b IS NULL) AS nulls, count(*) FILTER (WHERE b IS NOT NULL) AS boxes FROM pt;

-- phase 2: delete a third, vacuum, insert new rows one statement at a time
-- (splits on the insert path)
DELETE FROM pt WHERE id % 3 = 0;
VACUUM pt;
SELECT amrtree_check('pt_b');
SELECT entries FROM amrtree_index_stats('pt_b');
INSERT INTO pt
SELECT i,
       CASE WHEN i % 89 = 0 THEN NULL
            WHEN i % 29 = 0 THEN box '((0.25,0.25),(0.2500004,0.26))'
            ELSE box(point(x, y), point(x + w, y + w)) END
FROM (SELECT i, random() x, random() y, random() * 0.01 w
      FROM generate_series(30001, 45000) i) s;
VACUUM pt;
SELECT * FROM amr_parity('pt');
SELECT amrtree_check('pt_b');
SELECT entries FROM amrtree_index_stats('pt_b');

-- phase 3: REINDEX
REINDEX INDEX pt_b;
SELECT * FROM amr_parity('pt');
SELECT amrtree_check('pt_b');

-- phase 4: a build whose heap scan runs in parallel workers that stream
-- rows to the leader (where the server has workers to spare; otherwise
-- the build scans alone, with the same result)
SET max_parallel_maintenance_workers = 2;
SET min_parallel_table_scan_size = 0;
REINDEX INDEX pt_b;
RESET min_parallel_table_scan_size;
RESET max_parallel_maintenance_workers;
SELECT * FROM amr_parity('pt');
SELECT amrtree_check('pt_b');
SELECT entries FROM amrtree_index_stats('pt_b');

-- phase 5: builds larger than maintenance_work_mem, whose 1MB holds 16,131
-- rows here: the build sorts the rows in runs on temporary files and
-- merges them (NULL keys included); the planner gives a build in 1MB no
-- parallel workers (it wants 32MB for each participant) unless the table's
-- parallel_workers option names them, so the second build is serial too:
-- parallel builds that spill follow below
SET maintenance_work_mem = '1MB';
SET log_temp_files = -1;	-- pg_regress logs them; their names vary
SET client_min_messages = debug1;
REINDEX INDEX pt_b;
RESET client_min_messages;
SELECT * FROM amr_parity('pt');
SELECT amrtree_check('pt_b');
SELECT entries FROM amrtree_index_stats('pt_b');
SET max_parallel_maintenance_workers = 2;
SET min_parallel_table_scan_size = 0;
REINDEX INDEX pt_b;
RESET min_parallel_table_scan_size;
RESET max_parallel_maintenance_workers;
RESET maintenance_work_mem;
RESET log_temp_files;
SELECT * FROM amr_parity('pt');
SELECT amrtree_check('pt_b');
SELECT entries FROM amrtree_index_stats('pt_b');

-- more runs than one merge takes (1MB merges 64 at once): 1,040,000 rows
-- make 65 runs, and a first pass merges 64 of them into one (the last is
-- kept as it is) before the final merge
CREATE TABLE mp (id int, b box);
INSERT INTO mp
SELECT i, CASE WHEN i % 50 = 0 THEN box(point(x, y), point(x, y))
               WHEN i % 997 = 0 THEN NULL
               ELSE box(point(x, y), point(x + w, y + w * 3)) END
FROM (SELECT i, random() x, random() y, random() * 0.002 w
      FROM generate_series(1, 1040000) i) s;
CREATE TABLE mpq AS
SELECT g AS qid, box(point(x, y), point(x + 0.01 + g * 0.001, y + 0.02)) AS qb
FROM (SELECT g, random() x, random() y FROM generate_series(1, 40) g) s;
-- the windows' rows and the NULL keys through the index, and through a
-- sequential scan; amrtree_check; every row once in the leaves
CREATE FUNCTION mp_check() RETURNS TABLE (what text, result text)
LANGUAGE plpgsql AS $$
BEGIN
  SET LOCAL enable_seqscan = off;
  SET LOCAL enable_bitmapscan = off;
  CREATE TEMP TABLE mp_idx AS
  SELECT q.qid, count(*) AS n, sum(m.id) AS ids FROM mpq q JOIN mp m ON m.b && q.qb GROUP BY q.qid
  UNION ALL SELECT 0, count(*), sum(id) FROM mp WHERE b IS NULL;
  SET LOCAL enable_seqscan = on;
  SET LOCAL enable_indexscan = off;
  CREATE TEMP TABLE mp_seq AS
  SELECT q.qid, count(*) AS n, sum(m.id) AS ids FROM mpq q JOIN mp m ON m.b && q.qb GROUP BY q.qid
  UNION ALL SELECT 0, count(*), sum(id) FROM mp WHERE b IS NULL;
  RETURN QUERY SELECT 'windows (and NULL), rows', count(*) || ', ' || (sum(n) > 1000) FROM mp_seq;
  RETURN QUERY SELECT 'mismatches', count(*)::text FROM mp_seq FULL JOIN mp_idx USING (qid)
    WHERE mp_seq.n IS DISTINCT FROM mp_idx.n OR mp_seq.ids IS DISTINCT FROM mp_idx.ids;
  RETURN QUERY SELECT 'amrtree_check', amrtree_check('mp_b')::text;
  RETURN QUERY SELECT 'entries, distinct TIDs', count(*) || ', ' || count(DISTINCT tid)
    FROM amrtree_leaf_entries('mp_b');
  DROP TABLE mp_idx, mp_seq;
END $$;
SET maintenance_work_mem = '1MB';
SET max_parallel_maintenance_workers = 0;
SET log_temp_files = -1;
SET client_min_messages = debug1;
CREATE INDEX mp_b ON mp USING amrtree (b);
RESET client_min_messages;
RESET max_parallel_maintenance_workers;
SELECT * FROM mp_check();
-- in 64MB, which holds 1,032,444 rows, with a parallel worker: the leader
-- and the worker each scan blocks and sort runs of their own, half of the
-- memory each, and the leader merges both's (where the server has no
-- worker to spare, the leader spills alone, with the same result)
ANALYZE mp;
SET maintenance_work_mem = '64MB';
SET max_parallel_maintenance_workers = 2;
REINDEX INDEX mp_b;
RESET max_parallel_maintenance_workers;
RESET maintenance_work_mem;
SELECT * FROM mp_check();
-- in 1MB again, with the table's parallel_workers option, which PostgreSQL
-- takes over its rule of 32MB for each participant: the leader and two
-- workers sort runs of 5,377 rows each (a third of the memory), about 196
-- runs in all, so the merge passes read the workers' runs too
ALTER TABLE mp SET (parallel_workers = 2);
SET maintenance_work_mem = '1MB';
SET max_parallel_maintenance_workers = 2;
REINDEX INDEX mp_b;
RESET max_parallel_maintenance_workers;
RESET maintenance_work_mem;
RESET log_temp_files;
SELECT * FROM mp_check();
DROP TABLE mp, mpq;
DROP FUNCTION mp_check();

-- an index grown only by inserts, on the same rows
CREATE TABLE pt2 (id int, b box);
CREATE INDEX pt2_b ON pt2 USING amrtree (b);
INSERT INTO pt2 SELECT * FROM pt ORDER BY random();
VACUUM ANALYZE pt2;
SELECT * FROM amr_parity('pt2');
SELECT amrtree_check('pt2_b');
SELECT height >= 2 AS multi_level, leaves > 100 AS many_leaves FROM amrtree_index_stats('pt2_b');
