/*-------------------------------------------------------------------------
 *
 * amr_bitmap.c
 *		Lock-free bitmap allocator.
 *
 *-------------------------------------------------------------------------
 */
#include "amr_bitmap.h"

#include <string.h>

size_t
amr_bitmap_size(uint64_t nbits)
{
	return offsetof(AmrBitmap, words) + ((nbits + 63) / 64) * sizeof(uint64_t);
}

void
amr_bitmap_init(AmrBitmap *bm, uint64_t nbits)
{
	uint64_t	nwords = (nbits + 63) / 64;

	bm->nbits = nbits;
	bm->nwords = nwords;
	bm->hint = 0;
	bm->nset = 0;
	memset(bm->words, 0, nwords * sizeof(uint64_t));
	/* bits past the end are permanently "allocated" */
	if (nbits % 64 != 0)
		bm->words[nwords - 1] = ~UINT64_C(0) << (nbits % 64);
}

int64_t
amr_bitmap_alloc(AmrBitmap *bm)
{
	uint64_t	start = __atomic_load_n(&bm->hint, __ATOMIC_RELAXED);
	uint64_t	i;

	if (bm->nwords == 0)
		return -1;
	if (start >= bm->nwords)
		start = 0;
	for (i = 0; i < bm->nwords; i++)
	{
		uint64_t	w = start + i;
		uint64_t	old;

		if (w >= bm->nwords)
			w -= bm->nwords;
		old = __atomic_load_n(&bm->words[w], __ATOMIC_RELAXED);
		while (old != ~UINT64_C(0))
		{
			int			bit = __builtin_ctzll(~old);
			uint64_t	new = old | (UINT64_C(1) << bit);

			if (__atomic_compare_exchange_n(&bm->words[w], &old, new, false,
											__ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
			{
				__atomic_add_fetch(&bm->nset, 1, __ATOMIC_RELAXED);
				if (new == ~UINT64_C(0))
					__atomic_store_n(&bm->hint, w + 1, __ATOMIC_RELAXED);
				else if (w != start)
					__atomic_store_n(&bm->hint, w, __ATOMIC_RELAXED);
				return (int64_t) (w * 64 + bit);
			}
			/* old was refreshed by the failed CAS; retry this word */
		}
	}
	return -1;
}

bool
amr_bitmap_set(AmrBitmap *bm, uint64_t bit)
{
	uint64_t	mask = UINT64_C(1) << (bit % 64);
	uint64_t	old;

	if (bit >= bm->nbits)
		return false;
	old = __atomic_fetch_or(&bm->words[bit / 64], mask, __ATOMIC_ACQ_REL);
	if (old & mask)
		return false;
	__atomic_add_fetch(&bm->nset, 1, __ATOMIC_RELAXED);
	return true;
}

bool
amr_bitmap_clear(AmrBitmap *bm, uint64_t bit)
{
	uint64_t	mask = UINT64_C(1) << (bit % 64);
	uint64_t	old;

	if (bit >= bm->nbits)
		return false;
	old = __atomic_fetch_and(&bm->words[bit / 64], ~mask, __ATOMIC_ACQ_REL);
	if (!(old & mask))
		return false;
	__atomic_sub_fetch(&bm->nset, 1, __ATOMIC_RELAXED);
	/* prefer reusing low slots: keeps the used part of the pool compact */
	if (bit / 64 < __atomic_load_n(&bm->hint, __ATOMIC_RELAXED))
		__atomic_store_n(&bm->hint, bit / 64, __ATOMIC_RELAXED);
	return true;
}

bool
amr_bitmap_test(const AmrBitmap *bm, uint64_t bit)
{
	if (bit >= bm->nbits)
		return false;
	return (__atomic_load_n(&bm->words[bit / 64], __ATOMIC_ACQUIRE) &
			(UINT64_C(1) << (bit % 64))) != 0;
}

int64_t
amr_bitmap_alloc_keep(AmrBitmap *bm, uint64_t keep)
{
	/* a soft floor: racing allocators may dip into it by a few bits */
	if (bm->nbits - amr_bitmap_count(bm) <= keep)
		return -1;
	return amr_bitmap_alloc(bm);
}
