--
-- amrtree_tiering: the placement options and functions.  Outputs are the
-- settled, deterministic parts (counts against the budget), not timings.
--
-- pmem_budget accepts unlimited, a percentage, or a size
CREATE TABLE tb (id int, b box);
CREATE INDEX tb_bad ON tb USING amrtree (b) WITH (pmem_budget = 'lots');
CREATE INDEX tb_bad ON tb USING amrtree (b) WITH (pmem_budget = '0%');
CREATE INDEX tb_bad ON tb USING amrtree (b) WITH (pmem_budget = '101%');
CREATE INDEX tb_bad ON tb USING amrtree (b) WITH (pmem_budget = '-5MB');
CREATE INDEX tb_bad ON tb USING amrtree (b) WITH (pmem_budget = '0.5');
CREATE INDEX tb_bad ON tb USING amrtree (b) WITH (pmem_budget = '10XB');
CREATE INDEX tb_bad ON tb USING amrtree (b) WITH (tiering = maybe);
CREATE INDEX tb_a ON tb USING amrtree (b) WITH (pmem_budget = '20%');
CREATE INDEX tb_b ON tb USING amrtree (b) WITH (pmem_budget = '1.5GB', tiering = on);
CREATE INDEX tb_c ON tb USING amrtree (b) WITH (pmem_budget = 'unlimited');
CREATE INDEX tb_d ON tb USING amrtree (b) WITH (tiering = off);
SELECT relname, reloptions FROM pg_class WHERE relname LIKE 'tb\__' ORDER BY relname;
DROP TABLE tb;

-- a budget is enforced by amrtree_settle: PMEM holds exactly the budget
CREATE TABLE tt (id int, b box);
INSERT INTO tt SELECT i, box(point(i % 200, i / 200), point(i % 200 + 0.5, i / 200 + 0.5))
FROM generate_series(1, 30000) i;
CREATE INDEX tt_b ON tt USING amrtree (b) WITH (pmem_budget = '25%');
SELECT amrtree_settle('tt_b', 0) >= 0 AS settled;
SELECT tier, leaves > 0 AS has_leaves, budget_bytes IS NOT NULL AS has_budget
FROM amrtree_tier_stats('tt_b') ORDER BY tier;
SELECT (SELECT leaves FROM amrtree_tier_stats('tt_b') WHERE tier = 'pmem')
     = floor(0.25 * (SELECT sum(leaves) FROM amrtree_tier_stats('tt_b') WHERE tier <> 'dram')) AS pmem_is_budget,
       (SELECT bytes FROM amrtree_tier_stats('tt_b') WHERE tier = 'pmem')
     = (SELECT budget_bytes FROM amrtree_tier_stats('tt_b') WHERE tier = 'pmem') AS bytes_match;
SELECT count(*) = (SELECT leaves FROM amrtree_index_stats('tt_b')) AS one_row_per_leaf,
       sum(entries) = 30000 AS all_entries,
       bool_and(tier IN ('pmem', 'ssd')) AS tiers_named,
       bool_and(version >= 1) AS versioned,
       bool_and(hotness >= 0) AS hotness_known,
       bool_and(mbr IS NOT NULL) AS boxes_known
FROM amrtree_leaf_table('tt_b');
SELECT demotions > 0 AS demoted, budget_demotions = demotions AS by_budget,
       bytes_moved = 4096 * (promotions + demotions) AS bytes_counted,
       scans > 0 AS scanned, last_scan IS NOT NULL AS has_last_scan
FROM amrtree_migration_stats('tt_b');
SELECT amrtree_check('tt_b');

-- queries read SSD leaves transparently
SET enable_seqscan = off;
SELECT count(*) FROM tt WHERE b && box '((10,10),(60,60))';
SET enable_indexscan = off;
SELECT count(*) FROM tt WHERE b && box '((10,10),(60,60))';
RESET enable_indexscan;
SET enable_bitmapscan = off;
SELECT count(*) FROM (SELECT id FROM tt WHERE b && box '((10,10),(60,60))') s;
RESET enable_bitmapscan;
RESET enable_seqscan;
SELECT count(*) FROM tt WHERE b && box '((10,10),(60,60))';
-- demoted leaves went into the SSD cache, and the scans above looked there
SELECT size_bytes > 0 AS has_cache, fills > 0 AS filled, hits > 0 AS answered
FROM amrtree_ssd_cache_stats();

-- the budget can change; so can tiering
ALTER INDEX tt_b SET (pmem_budget = '60%');
SELECT amrtree_settle('tt_b', 0) >= 0 AS settled;
SELECT (SELECT leaves FROM amrtree_tier_stats('tt_b') WHERE tier = 'pmem')
     <= floor(0.60 * (SELECT sum(leaves) FROM amrtree_tier_stats('tt_b') WHERE tier <> 'dram')) AS within_budget;
ALTER INDEX tt_b SET (tiering = off);
SELECT amrtree_settle('tt_b', 0) >= 0 AS settled;
SELECT tier, leaves > 0 AS has_leaves FROM amrtree_tier_stats('tt_b') WHERE tier <> 'dram' ORDER BY tier;
ALTER INDEX tt_b RESET (tiering, pmem_budget);

-- strict: while over budget, new leaves go to SSD at once, no settle needed
CREATE TABLE ts (id int, b box);
CREATE INDEX ts_b ON ts USING amrtree (b) WITH (pmem_budget = '10%');
SET amrtree.budget_on_insert = strict;
INSERT INTO ts SELECT i, box(point(i % 200, i / 200), point(i % 200 + 0.5, i / 200 + 0.5))
FROM generate_series(1, 20000) i;
RESET amrtree.budget_on_insert;
SELECT (SELECT leaves FROM amrtree_tier_stats('ts_b') WHERE tier = 'pmem')
     <= ceil(0.10 * (SELECT sum(leaves) FROM amrtree_tier_stats('ts_b') WHERE tier <> 'dram')) + 1 AS capped_while_inserting;
SELECT amrtree_check('ts_b');
SET enable_seqscan = off;
SELECT count(*) FROM ts WHERE b && box '((10,10),(60,60))';
RESET enable_seqscan;

-- errors
SELECT amrtree_settle('tt_b', -1);
SELECT amrtree_settle('tt_b', 'NaN');
-- an index rebuilt by this transaction settles after the commit: a warning
-- says so instead of a silent 0
ALTER INDEX tt_b SET (pmem_budget = '25%');
BEGIN;
REINDEX INDEX tt_b;
SELECT amrtree_settle('tt_b', 0);
COMMIT;
SELECT amrtree_settle('tt_b', 0) >= 0 AS settled_after_commit;
SELECT (SELECT leaves FROM amrtree_tier_stats('tt_b') WHERE tier = 'pmem')
     = floor(0.25 * (SELECT sum(leaves) FROM amrtree_tier_stats('tt_b') WHERE tier <> 'dram')) AS pmem_is_budget;
SELECT * FROM amrtree_tier_stats('pg_class_oid_index');
SET amrtree.budget_on_insert = sometimes;
DROP TABLE tt, ts;
