--
-- amrtree_temp: indexes on temporary tables, as GiST allows them -- built,
-- inserted into, scanned, truncated, rebuilt, emptied and dropped at commit
-- -- answer like a sequential scan and leave nothing behind in the pool.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS amrtree;
RESET client_min_messages;
SELECT leaf_ids_used AS leaves_before, indexes AS indexes_before FROM amrtree_pool_stats() \gset

CREATE TEMP TABLE tt (id int, b box);
INSERT INTO tt SELECT i, box(point(i % 100, i / 100), point(i % 100 + 0.5, i / 100 + 0.5))
FROM generate_series(1, 5000) i;
CREATE INDEX tt_b ON tt USING amrtree (b);
INSERT INTO tt SELECT i, box(point(i % 70, i / 70), point(i % 70 + 2, i / 70 + 2))
FROM generate_series(5001, 8000) i;
INSERT INTO tt VALUES (0, NULL), (-1, box '((NaN,1),(2,3))');
SELECT amrtree_check('tt_b');

CREATE FUNCTION tt_ids(op text, q box, use_index bool) RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE r int[];
BEGIN
  PERFORM set_config('enable_seqscan', CASE WHEN use_index THEN 'off' ELSE 'on' END, true);
  PERFORM set_config('enable_indexscan', CASE WHEN use_index THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_bitmapscan', CASE WHEN use_index THEN 'on' ELSE 'off' END, true);
  EXECUTE format('SELECT coalesce(array_agg(id ORDER BY id), ''{}'') FROM tt WHERE b %s $1', op)
    INTO r USING q;
  RETURN r;
END $$;
CREATE TEMP TABLE tt_q (op text, q box);
INSERT INTO tt_q SELECT op, q
FROM unnest(ARRAY['<<','&<','&&','&>','>>','~=','@>','<@','&<|','<<|','|>>','|&>']) op,
     unnest(ARRAY[box '((10,10),(20,20))', box '((0,0),(100,120))', box '((50.5,30.5),(50.5,30.5))']) q;
SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT id FROM tt WHERE b && box '((10,10),(20,20))';
RESET enable_seqscan;
SELECT count(*) AS queries,
       count(*) FILTER (WHERE tt_ids(op, q, true) <> tt_ids(op, q, false)) AS mismatches,
       sum(cardinality(tt_ids(op, q, false))) AS rows_matched
FROM tt_q;

-- DELETE + VACUUM, TRUNCATE, REINDEX, a rolled-back rebuild
DELETE FROM tt WHERE id % 3 = 0;
VACUUM tt;
SELECT amrtree_check('tt_b');
SELECT count(*) FILTER (WHERE tt_ids(op, q, true) <> tt_ids(op, q, false)) AS mismatches FROM tt_q;
REINDEX INDEX tt_b;
SELECT amrtree_check('tt_b');
BEGIN;
TRUNCATE tt;
INSERT INTO tt VALUES (1, box '((1,1),(2,2))');
ROLLBACK;
SELECT count(*) FILTER (WHERE tt_ids(op, q, true) <> tt_ids(op, q, false)) AS mismatches FROM tt_q;
TRUNCATE tt;
INSERT INTO tt VALUES (1, box '((1,1),(2,2))');
SET enable_seqscan = off;
SELECT id FROM tt WHERE b && box '((0,0),(5,5))';
RESET enable_seqscan;
SELECT entries FROM amrtree_index_stats('tt_b');

-- ON COMMIT DELETE ROWS empties the index with the table at each commit
CREATE TEMP TABLE tt_rows (id int, b box) ON COMMIT DELETE ROWS;
CREATE INDEX tt_rows_b ON tt_rows USING amrtree (b);
BEGIN;
INSERT INTO tt_rows SELECT i, box(point(i, i), point(i + 1, i + 1)) FROM generate_series(1, 500) i;
SET LOCAL enable_seqscan = off;
SELECT count(*) FROM tt_rows WHERE b && box '((10,10),(20,20))';
COMMIT;
SELECT entries FROM amrtree_index_stats('tt_rows_b');
SELECT amrtree_check('tt_rows_b');

-- ON COMMIT DROP
BEGIN;
CREATE TEMP TABLE tt_drop (b box) ON COMMIT DROP;
CREATE INDEX ON tt_drop USING amrtree (b);
INSERT INTO tt_drop SELECT box(point(i, i), point(i, i)) FROM generate_series(1, 300) i;
COMMIT;

-- a temporary and a permanent index may not share a tree, whatever their
-- relfilenodes
CREATE TABLE perm (id int, b box);
INSERT INTO perm SELECT i, box(point(i, 0), point(i, 1)) FROM generate_series(1, 1000) i;
CREATE INDEX perm_b ON perm USING amrtree (b);
SELECT amrtree_check('perm_b'), amrtree_check('tt_b');
DROP TABLE perm;

DROP TABLE tt, tt_rows;
DROP FUNCTION tt_ids(text, box, bool);
-- nothing left behind
SELECT leaf_ids_used - :leaves_before AS leaves_left, indexes - :indexes_before AS indexes_left
FROM amrtree_pool_stats();
