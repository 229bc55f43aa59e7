-- Range query: a window of half-size :hw x :hh centred on a random data box.
-- Variables (pgbench -D): tbl (table with column b box), n (rows in
-- bench_centers), hw, hh (half-width, half-height; bench/compare calibrates
-- them to a selectivity).  See bench/README.md.
\set k random(1, :n)
SELECT count(*) FROM :tbl
WHERE b && (SELECT box(point(x - :hw, y - :hh), point(x + :hw, y + :hh))
            FROM bench_centers WHERE id = :k);
