-- KNN on points: the 10 points (box centres) nearest a random data box's
-- centre.  Variables (pgbench -D): tbl (table with column p point), n (rows
-- in bench_centers).  See bench/README.md.
\set k random(1, :n)
SELECT count(*) FROM (SELECT 1 FROM :tbl
  ORDER BY p <-> (SELECT point(x, y) FROM bench_centers WHERE id = :k) LIMIT 10) s;
