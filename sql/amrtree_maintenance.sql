--
-- amrtree_maintenance: DDL keeps the pool consistent.  Every operation that
-- gives an index new storage, drops it, or rolls back must leave the pool's
-- slot and leaf-id usage where it belongs, and amrtree_check must hold.
--
CREATE TABLE m (id int, b box);
INSERT INTO m SELECT i, box(point(i % 100, i / 100), point(i % 100 + 1, i / 100 + 1))
FROM generate_series(1, 20000) i;

SELECT leaf_ids_used AS base, pmem_slots_used AS base_slots FROM amrtree_pool_stats() \gset
CREATE INDEX m_b ON m USING amrtree (b);
SELECT leaves AS m_leaves FROM amrtree_index_stats('m_b') \gset
SELECT leaf_ids_used - :base = :m_leaves AS leaves_in_use,
       pmem_slots_used - :base_slots = :m_leaves AS slots_in_use
FROM amrtree_pool_stats();

-- a rolled-back CREATE INDEX leaves nothing behind
BEGIN;
CREATE INDEX m_b2 ON m USING amrtree (b);
ROLLBACK;
SELECT leaf_ids_used - :base = :m_leaves AS unchanged FROM amrtree_pool_stats();

-- ... nor does one rolled back to a savepoint
BEGIN;
SAVEPOINT s1;
CREATE INDEX m_b2 ON m USING amrtree (b);
ROLLBACK TO s1;
CREATE INDEX m_b3 ON m USING amrtree (b);
COMMIT;
SELECT leaf_ids_used - :base = 2 * :m_leaves AS two_indexes FROM amrtree_pool_stats();
DROP INDEX m_b3;
SELECT leaf_ids_used - :base = :m_leaves AS dropped FROM amrtree_pool_stats();

-- a DROP rolled back keeps the index working
BEGIN;
DROP INDEX m_b;
ROLLBACK;
SELECT amrtree_check('m_b');
SELECT leaf_ids_used - :base = :m_leaves AS kept FROM amrtree_pool_stats();

-- REINDEX, VACUUM FULL, CLUSTER give new storage; the old tree goes
REINDEX INDEX m_b;
SELECT leaf_ids_used - :base = :m_leaves AS after_reindex FROM amrtree_pool_stats();
SELECT amrtree_check('m_b');
VACUUM FULL m;
SELECT leaf_ids_used - :base = :m_leaves AS after_vacuum_full FROM amrtree_pool_stats();
SELECT amrtree_check('m_b');
CLUSTER m USING m_b;
SELECT leaf_ids_used - :base = :m_leaves AS after_cluster FROM amrtree_pool_stats();
SELECT amrtree_check('m_b');
REINDEX INDEX CONCURRENTLY m_b;
SELECT leaf_ids_used - :base = :m_leaves AS after_reindex_concurrently FROM amrtree_pool_stats();
SELECT amrtree_check('m_b');
SET enable_seqscan = off;
SELECT count(*) FROM m WHERE b && box '((10,10),(11,11))';
RESET enable_seqscan;

-- TRUNCATE: rolled back, the old tree is still there; committed, it is gone
BEGIN;
TRUNCATE m;
ROLLBACK;
SELECT leaf_ids_used - :base = :m_leaves AS truncate_rolled_back FROM amrtree_pool_stats();
SELECT amrtree_check('m_b');
BEGIN;
SAVEPOINT s2;
TRUNCATE m;
ROLLBACK TO s2;
COMMIT;
SELECT count(*) FROM m;
SELECT amrtree_check('m_b');
TRUNCATE m;
SELECT leaf_ids_used - :base AS after_truncate FROM amrtree_pool_stats();
SELECT amrtree_check('m_b');
SELECT entries FROM amrtree_index_stats('m_b');

-- a table created and truncated in one transaction rebuilds in place
BEGIN;
CREATE TABLE m2 (b box);
INSERT INTO m2 SELECT box(point(i, i), point(i, i)) FROM generate_series(1, 5000) i;
CREATE INDEX m2_b ON m2 USING amrtree (b);
TRUNCATE m2;
INSERT INTO m2 VALUES (box '((1,1),(2,2))');
COMMIT;
SELECT amrtree_check('m2_b');
SELECT entries FROM amrtree_index_stats('m2_b');

-- CREATE INDEX CONCURRENTLY
INSERT INTO m SELECT i, box(point(i, 0), point(i + 1, 1)) FROM generate_series(1, 3000) i;
CREATE INDEX CONCURRENTLY m_cic ON m USING amrtree (b);
SELECT amrtree_check('m_cic');
SELECT entries FROM amrtree_index_stats('m_cic');

-- amrtree_check in a transaction that drops or rewrites another amrtree
-- index: the old tree is still in the pool, no longer in our catalog
-- snapshot, and is not a leaked tree (it said so)
CREATE TABLE m3 (b box);
CREATE INDEX m3_b ON m3 USING amrtree (b);
BEGIN;
DROP INDEX m3_b;
SELECT amrtree_check('m_cic');
ROLLBACK;
BEGIN;
TRUNCATE m3;
SELECT amrtree_check('m_cic');
ROLLBACK;
BEGIN;
REINDEX INDEX m3_b;
SELECT amrtree_check('m_cic');
ROLLBACK;
DROP TABLE m3;

-- an index left invalid by a failed CREATE INDEX CONCURRENTLY is not
-- rebuilt in the background, and says so
CREATE FUNCTION m_boom(box) RETURNS box LANGUAGE plpgsql IMMUTABLE AS
  $$ BEGIN IF $1 ~= box '(300,1),(301,0)' THEN RAISE 'boom'; END IF; RETURN $1; END $$;
CREATE INDEX CONCURRENTLY m_invalid ON m USING amrtree (m_boom(b));
SELECT indisvalid FROM pg_index WHERE indexrelid = 'm_invalid'::regclass;
SELECT status FROM amrtree_index_stats('m_invalid');
SELECT amrtree_check('m_invalid');
DROP INDEX m_invalid;
DROP FUNCTION m_boom(box);

-- DROP TABLE frees every index of it
SELECT leaf_ids_used AS before_drop FROM amrtree_pool_stats() \gset
SELECT (SELECT leaves FROM amrtree_index_stats('m_b')) + (SELECT leaves FROM amrtree_index_stats('m_cic'))
  + (SELECT leaves FROM amrtree_index_stats('m2_b')) AS m_all \gset
DROP TABLE m, m2;
SELECT :before_drop - leaf_ids_used = :m_all AS all_freed FROM amrtree_pool_stats();
