# Test lists for scripts/test.sh (kept in make syntax so the Makefile could
# include them too).
REGRESS_TESTS = amrtree_basic amrtree_privileges amrtree_gist_parity amrtree_opclasses amrtree_temp amrtree_parity amrtree_maintenance amrtree_tiering
ISOLATION_TESTS = insert_scan insert_vacuum drop_concurrently predicate_lock predicate_lock_first_leaf knn_insert_vacuum inspect_dropped
# Run after the others, only where PostGIS is installed (scripts/test.sh
# says SKIP otherwise): it creates the postgis extension.
POSTGIS_REGRESS_TESTS = amrtree_postgis amrtree_postgis_support amrtree_postgis_geography
