-- KNN: the 10 boxes nearest a random data box's centre, in distance order
-- (an index scan with "Order By" where the method supports it).
-- Variables (pgbench -D): tbl (table with column b box), n (rows in
-- bench_centers).  See bench/README.md.
\set k random(1, :n)
SELECT count(*) FROM (SELECT 1 FROM :tbl
  ORDER BY b <-> (SELECT point(x, y) FROM bench_centers WHERE id = :k) LIMIT 10) s;
