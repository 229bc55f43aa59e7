-- Skewed range query: the centre is drawn from the first :nhot centres with
-- a Zipf-like law, so a few regions are hot and most are cold (hot and cold
-- leaves for the tier manager).  Variables as range.sql, plus nhot.
\set k random_zipfian(1, :nhot, 1.1)
SELECT count(*) FROM :tbl
WHERE b && (SELECT box(point(x - :hw, y - :hh), point(x + :hw, y + :hh))
            FROM bench_centers WHERE id = :k);
