--
-- amrtree_gist_parity: amrtree answers every box operator exactly as a
-- sequential scan does, on the values of PostgreSQL's own regression tables
-- (box_tbl, point_tbl as degenerate boxes, including the NaN point) and on
-- boxes with NaN, infinite, huge, degenerate and duplicate coordinates and
-- NULLs, for query boxes of the same kinds; and exactly as GiST does where
-- GiST is right.  GiST is not right once boxes with NaN coordinates are
-- spread over many of its pages: the union keys of its inner pages become
-- NaN and whole subtrees are skipped (an && over the infinite window found
-- about a quarter of the rows here), so on that data amrtree is held to the
-- sequential scan only.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS amrtree;
RESET client_min_messages;
SELECT setseed(0.7);

CREATE TABLE gp_rows (id serial, b box);
-- box_tbl of PostgreSQL's box regression test
INSERT INTO gp_rows (b) VALUES
  ('(2.0,2.0,0.0,0.0)'), ('(1.0,1.0,3.0,3.0)'), ('((-8, 2), (-2, -10))'),
  ('(2.5, 2.5, 2.5,3.5)'), ('(3.0, 3.0,3.0,3.0)');
-- point_tbl of PostgreSQL's point regression test, as boxes (without
-- (1e-300,-1e-300): GiST's penalty arithmetic fails on it with "value out
-- of range: underflow"; it has a test of its own below)
INSERT INTO gp_rows (b)
SELECT box(p, p) FROM unnest(ARRAY['(0.0,0.0)', '(-10.0,0.0)', '(-3.0,4.0)', '(5.1, 34.5)',
  '(-5.0,-12.0)', '(1e+300,Inf)', '(Inf,1e+300)', '(NaN,NaN)',
  '(10.0,10.0)']::point[]) p;
-- NaN in every position, infinities, huge, degenerate, duplicates, NULL
INSERT INTO gp_rows (b) VALUES
  ('((NaN,0),(1,1))'), ('((0,NaN),(1,1))'), ('((0,0),(NaN,1))'), ('((0,0),(1,NaN))'),
  ('((NaN,NaN),(1,1))'), ('((NaN,NaN),(NaN,NaN))'), ('((NaN,2),(3,NaN))'),
  ('((5,5),(NaN,6))'), ('((-Infinity,NaN),(0,0))'), ('((NaN,-Infinity),(Infinity,0))'),
  ('((-Infinity,-Infinity),(Infinity,Infinity))'), ('((-1e300,0),(1e300,1))'),
  ('((0.5,0.5),(0.5,0.5))'), ('((0.5,0.5),(0.5,0.5))'), ('((0.5,0.5),(0.5000004,0.5))'),
  (NULL), (NULL);
-- enough ordinary boxes, and more NaN ones, for a tree of several levels
INSERT INTO gp_rows (b)
SELECT CASE WHEN i % 50 = 0 THEN box(point('NaN', y), point(x, y + 1))
            WHEN i % 77 = 0 THEN box(point(x, y), point(x, 'NaN'))
            WHEN i % 91 = 0 THEN NULL
            ELSE box(point(x, y), point(x + w, y + w)) END
FROM (SELECT i, random() * 20 - 10 x, random() * 20 - 10 y, random() * 0.5 w
      FROM generate_series(1, 6000) i) s;

CREATE TABLE gp_amr AS SELECT * FROM gp_rows;
CREATE INDEX gp_amr_b ON gp_amr USING amrtree (b);
-- the same rows without NaN, with both kinds of index
CREATE TABLE gp_plain AS SELECT * FROM gp_rows WHERE b IS NULL OR b::text NOT LIKE '%NaN%';
CREATE TABLE gp_gist AS SELECT * FROM gp_plain;
CREATE INDEX gp_plain_b ON gp_plain USING amrtree (b);
CREATE INDEX gp_gist_b ON gp_gist USING gist (b);
VACUUM ANALYZE gp_amr;
VACUUM ANALYZE gp_plain;
VACUUM ANALYZE gp_gist;
SELECT amrtree_check('gp_amr_b'), amrtree_check('gp_plain_b');

CREATE TABLE gp_q (qb box);
INSERT INTO gp_q SELECT b FROM gp_rows WHERE id <= 32 AND b IS NOT NULL;
INSERT INTO gp_q VALUES ('((0,0),(1,1))'), ('((-10,-10),(10,10))'), ('((NaN,NaN),(NaN,NaN))'),
  ('((NaN,0),(1,1))'), ('((1,1),(NaN,2))'), ('((-Infinity,-Infinity),(Infinity,Infinity))'),
  ('((-Infinity,0),(0,Infinity))'), ('((3,3),(3,3))');
INSERT INTO gp_q SELECT box(point(x, y), point(x + w, y + w))
FROM (SELECT random() * 20 - 10 x, random() * 20 - 10 y, random() * 3 w
      FROM generate_series(1, 12)) s;

CREATE TABLE gp_ops (op text);
INSERT INTO gp_ops VALUES ('<<'), ('&<'), ('&&'), ('&>'), ('>>'), ('~='),
                          ('@>'), ('<@'), ('&<|'), ('<<|'), ('|>>'), ('|&>');

-- ids matching "b <op> qb" in tbl, with only the given scan allowed (the
-- plan is checked, so no comparison passes on two sequential scans)
CREATE FUNCTION gp_ids(tbl regclass, op text, qb box, scan text)
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

CREATE TABLE gp_result AS
SELECT op, qb,
       gp_ids('gp_amr', op, qb, 'seq') AS seq,
       gp_ids('gp_amr', op, qb, 'index') AS amr_index,
       gp_ids('gp_amr', op, qb, 'bitmap') AS amr_bitmap,
       gp_ids('gp_plain', op, qb, 'seq') AS plain_seq,
       gp_ids('gp_plain', op, qb, 'index') AS plain_index,
       gp_ids('gp_gist', op, qb, 'index') AS gist_index
FROM gp_ops, gp_q;

-- every (operator, query): amrtree = sequential scan, and without NaN also = GiST
SELECT count(*) AS comparisons,
       count(*) FILTER (WHERE amr_index <> seq) AS index_vs_seq,
       count(*) FILTER (WHERE amr_bitmap <> seq) AS bitmap_vs_seq,
       count(*) FILTER (WHERE plain_index <> plain_seq) AS plain_index_vs_seq,
       count(*) FILTER (WHERE plain_index <> gist_index) AS plain_amrtree_vs_gist,
       sum(cardinality(seq)) AS rows_matched
FROM gp_result;
-- rows with NaN really are found (not only never matched)
SELECT count(*) > 0 AS nan_rows_returned
FROM gp_result, unnest(amr_index) i, gp_rows r
WHERE r.id = i AND (r.b::text LIKE '%NaN%');
-- any disagreement, in full
SELECT op, qb, seq, amr_index, amr_bitmap FROM gp_result
WHERE amr_index <> seq OR amr_bitmap <> seq OR plain_index <> plain_seq OR plain_index <> gist_index
LIMIT 5;

-- the same after the rows arrived by insertion rather than by a build, and
-- after VACUUM removed some of them
TRUNCATE gp_amr, gp_plain;
INSERT INTO gp_amr SELECT * FROM gp_rows;
INSERT INTO gp_plain SELECT * FROM gp_gist;
DELETE FROM gp_amr WHERE id % 7 = 0;
DELETE FROM gp_plain WHERE id % 7 = 0;
DELETE FROM gp_gist WHERE id % 7 = 0;
VACUUM gp_amr;
VACUUM gp_plain;
VACUUM gp_gist;
SELECT amrtree_check('gp_amr_b'), amrtree_check('gp_plain_b');
SELECT count(*) AS comparisons,
       count(*) FILTER (WHERE gp_ids('gp_amr', op, qb, 'index') <> gp_ids('gp_amr', op, qb, 'seq')) AS index_vs_seq,
       count(*) FILTER (WHERE gp_ids('gp_plain', op, qb, 'index') <> gp_ids('gp_gist', op, qb, 'index')) AS plain_amrtree_vs_gist
FROM gp_ops, gp_q;

-- a value GiST cannot always index (its build may fail with an underflow,
-- depending on the order it meets the rows): amrtree answers like a
-- sequential scan
CREATE TABLE gp_tiny AS SELECT * FROM gp_rows;
INSERT INTO gp_tiny (b) VALUES (box(point '(1e-300,-1e-300)', point '(1e-300,-1e-300)'));
CREATE INDEX gp_tiny_b ON gp_tiny USING amrtree (b);
SELECT count(*) AS comparisons,
       count(*) FILTER (WHERE gp_ids('gp_tiny', op, qb, 'index') <> gp_ids('gp_tiny', op, qb, 'seq')) AS index_vs_seq
FROM gp_ops, (SELECT qb FROM gp_q UNION ALL SELECT box '((0,0),(1e-200,1e-200))') q;

DROP TABLE gp_rows, gp_amr, gp_plain, gp_gist, gp_q, gp_ops, gp_result, gp_tiny;
DROP FUNCTION gp_ids(regclass, text, box, text);
