/*-------------------------------------------------------------------------
 *
 * amr_bitmap.h
 *		Lock-free bitmap allocator for fixed-size slots and leaf ids.
 *
 * Lives in shared memory; every operation is a compare-and-swap on one
 * 64-bit word, so backends, the tier manager and the build can allocate
 * concurrently without a lock (paper 003: DRAM bitmaps for PMEM free space,
 * rebuilt by scanning after a restart).
 *
 *-------------------------------------------------------------------------
 */
#ifndef AMR_BITMAP_H
#define AMR_BITMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct AmrBitmap
{
	uint64_t	nbits;
	uint64_t	nwords;
	uint64_t	hint;			/* word to start searching at (racy hint) */
	uint64_t	nset;			/* bits set, maintained atomically */
	uint64_t	words[];
} AmrBitmap;

/* Bytes a bitmap of nbits bits takes. */
extern size_t amr_bitmap_size(uint64_t nbits);

/* Make bm an all-free bitmap of nbits bits. */
extern void amr_bitmap_init(AmrBitmap *bm, uint64_t nbits);

/* Allocate any clear bit; returns -1 when full. */
extern int64_t amr_bitmap_alloc(AmrBitmap *bm);

/* Allocate only while more than "keep" bits are clear (a reserve). */
extern int64_t amr_bitmap_alloc_keep(AmrBitmap *bm, uint64_t keep);

/* Set a specific bit; returns false if it was already set. */
extern bool amr_bitmap_set(AmrBitmap *bm, uint64_t bit);

/* Clear a bit; returns false if it was already clear. */
extern bool amr_bitmap_clear(AmrBitmap *bm, uint64_t bit);

extern bool amr_bitmap_test(const AmrBitmap *bm, uint64_t bit);

static inline uint64_t
amr_bitmap_count(const AmrBitmap *bm)
{
	return __atomic_load_n(&bm->nset, __ATOMIC_RELAXED);
}

#endif							/* AMR_BITMAP_H */
