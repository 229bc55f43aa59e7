/*-------------------------------------------------------------------------
 *
 * amr_atomic.h
 *		The atomic operations on fields that the tree core and the
 *		PostgreSQL side share (AmrTree, AmrLeafVolatile), in two kinds.
 *
 * Counters are relaxed: statistics, sizes and access counts, where a value
 * a moment old is harmless (the planner's leaf count, the tier manager's
 * hotness input).  Synchronising operations are sequentially consistent:
 * scan pins and pending drops, where one process must see another's
 * increment before it goes on (VACUUM waiting for pins, amrtree_check
 * skipping a tree being dropped), and the split counter, which orders a
 * scan's start against splits.  The core is free of PostgreSQL headers, so
 * these wrap the compiler's builtins rather than pg_atomic_*, whose types
 * the core's structures cannot use.
 *
 *-------------------------------------------------------------------------
 */
#ifndef AMR_ATOMIC_H
#define AMR_ATOMIC_H

#include <stdbool.h>

/* counters (relaxed) */
#define amr_counter_read(p)			__atomic_load_n((p), __ATOMIC_RELAXED)
#define amr_counter_add(p, v)		((void) __atomic_add_fetch((p), (v), __ATOMIC_RELAXED))
#define amr_counter_sub(p, v)		((void) __atomic_sub_fetch((p), (v), __ATOMIC_RELAXED))
#define amr_counter_set(p, v)		__atomic_store_n((p), (v), __ATOMIC_RELAXED)

/* synchronising operations (sequentially consistent) */
#define amr_sync_read(p)			__atomic_load_n((p), __ATOMIC_SEQ_CST)
#define amr_sync_add(p, v)			__atomic_add_fetch((p), (v), __ATOMIC_SEQ_CST)
#define amr_sync_sub(p, v)			__atomic_sub_fetch((p), (v), __ATOMIC_SEQ_CST)
#define amr_sync_set(p, v)			__atomic_store_n((p), (v), __ATOMIC_SEQ_CST)

/* a flag taken by compare-and-swap and released with release semantics */
#define amr_flag_try_take(p, expected, value) \
	__atomic_compare_exchange_n((p), (expected), (value), false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)
#define amr_flag_release(p)			__atomic_store_n((p), 0, __ATOMIC_RELEASE)

#endif							/* AMR_ATOMIC_H */
