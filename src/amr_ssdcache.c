/*-------------------------------------------------------------------------
 *
 * amr_ssdcache.c
 *		A clean DRAM cache of SSD leaf images (amrtree.ssd_cache_size).
 *
 * The SSD tier is read with O_DIRECT, so the kernel's page cache never
 * holds its blocks; without a cache of our own, every access to a leaf on
 * SSD waits for the device (a 4 KiB read takes 100-300 us on the machines
 * we measured, against ~1 us for a PMEM copy).  A budget makes that the
 * common case: the tier manager demotes the coldest leaves, and an insert
 * or query that reaches one of them soon after would read it straight back.
 *
 * The cache only ever holds copies.  The SSD slot stays the durable image
 * and the Leaf Table word stays the only pointer: a cached copy is tagged
 * with the word (tier, slot, version) of the image it copies, and a lookup
 * succeeds only for the word the caller has just read.  SSD images are
 * immutable while a word names them and versions only grow, so a tag that
 * matches can only be a copy of the image the word names; a leaf that moved
 * or changed simply stops matching and its slot is recycled by the clock.
 * Nothing is ever invalidated, and no lock is shared with the tree: slots
 * are claimed with a compare-and-swap and read under a sequence counter
 * (odd while a slot is being refilled), as PostgreSQL does for
 * pg_stat_activity.
 *
 * Each leaf's volatile state carries a hint of the slot that last held it;
 * a stale hint costs a tag comparison.
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include "port/atomics.h"

typedef struct AmrSsdCacheSlot
{
	pg_atomic_uint32 seq;		/* odd while the slot is being filled */
	pg_atomic_uint32 referenced;	/* the clock's second chance */
	uint32		leaf_id;
	uint32		tree_no;
	uint32		generation;
	uint32		pad;
	uint64		word;			/* the Leaf Table word of the copied image */
} AmrSsdCacheSlot;

typedef struct AmrSsdCacheControl
{
	pg_atomic_uint32 hand;		/* clock hand (modulo nslots) */
	uint32		nslots;
	pg_atomic_uint64 hits;		/* images copied from the cache */
	pg_atomic_uint64 device_reads;	/* images read from the slot file */
	pg_atomic_uint64 fills;		/* images put in the cache */
} AmrSsdCacheControl;

static AmrSsdCacheControl *cache_ctl = NULL;
static AmrSsdCacheSlot *cache_slots = NULL;
static char *cache_images = NULL;	/* nslots x AMR_SLOT_SIZE */

/* Slots that amrtree.ssd_cache_size buys (0 disables the cache). */
uint32
amr_ssd_cache_nslots(void)
{
	return (uint32) Min((Size) amr_ssd_cache_kb * 1024 / AMR_SLOT_SIZE,
						(Size) PG_INT32_MAX);
}

/* Shared memory for nslots slots, images 4 KiB aligned from "base". */
Size
amr_ssd_cache_shmem_size(uint32 nslots)
{
	Size		sz = CACHELINEALIGN(sizeof(AmrSsdCacheControl));

	sz = CACHELINEALIGN(sz + sizeof(AmrSsdCacheSlot) * (Size) nslots);
	sz = TYPEALIGN(AMR_SLOT_SIZE, sz);
	return sz + (Size) nslots * AMR_SLOT_SIZE;
}

/* Attach (and on first use initialize) the cache at a 4 KiB-aligned base. */
void
amr_ssd_cache_attach(char *base, uint32 nslots, bool init)
{
	Size		off = CACHELINEALIGN(sizeof(AmrSsdCacheControl));
	uint32		i;

	cache_ctl = (AmrSsdCacheControl *) base;
	cache_slots = (AmrSsdCacheSlot *) (base + off);
	off = CACHELINEALIGN(off + sizeof(AmrSsdCacheSlot) * (Size) nslots);
	cache_images = base + TYPEALIGN(AMR_SLOT_SIZE, off);
	if (!init)
		return;
	cache_ctl->nslots = nslots;
	pg_atomic_init_u32(&cache_ctl->hand, 0);
	pg_atomic_init_u64(&cache_ctl->hits, 0);
	pg_atomic_init_u64(&cache_ctl->device_reads, 0);
	pg_atomic_init_u64(&cache_ctl->fills, 0);
	for (i = 0; i < nslots; i++)
	{
		AmrSsdCacheSlot *cs = &cache_slots[i];

		pg_atomic_init_u32(&cs->seq, 0);
		pg_atomic_init_u32(&cs->referenced, 0);
		cs->leaf_id = AMR_INVALID_LEAF;
		cs->word = 0;
	}
}

static inline bool
cache_enabled(void)
{
	return cache_ctl != NULL && cache_ctl->nslots > 0;
}

/* The slot the leaf's hint names, or NULL (no cache, no hint). */
static inline AmrSsdCacheSlot *
hinted_slot(uint32 leaf_id, uint32 *slot_no)
{
	uint32		hint;

	if (!cache_enabled())
		return NULL;
	hint = amr_counter_read(&amr_store.leaves[leaf_id].ssd_cache_hint);
	if (hint == 0 || hint > cache_ctl->nslots)
		return NULL;
	*slot_no = hint - 1;
	return &cache_slots[hint - 1];
}

/*
 * Copy the image that "word" names for leaf_id of tree t into buf, if the
 * cache holds it.  The copy is as good as a read of the SSD slot made at the
 * moment the caller read the word.
 */
bool
amr_ssd_cache_get(const AmrTree *t, uint32 leaf_id, uint64 word, AmrLeaf *buf)
{
	uint32		slot_no;
	AmrSsdCacheSlot *cs = hinted_slot(leaf_id, &slot_no);
	uint32		seq;

	if (cs == NULL)
		return false;
	seq = pg_atomic_read_u32(&cs->seq);
	if (seq & 1)
		return false;
	pg_read_barrier();
	if (cs->leaf_id != leaf_id || cs->word != word ||
		cs->tree_no != t->tree_no || cs->generation != t->generation)
		return false;
	memcpy(buf, cache_images + (Size) slot_no * AMR_SLOT_SIZE, AMR_SLOT_SIZE);
	pg_read_barrier();
	if (pg_atomic_read_u32(&cs->seq) != seq)
		return false;			/* refilled while we copied */
	if (pg_atomic_read_u32(&cs->referenced) == 0)
		pg_atomic_write_u32(&cs->referenced, 1);
	pg_atomic_fetch_add_u64(&cache_ctl->hits, 1);
	return true;
}

/* n leaf images were read from the slot file (for the statistics). */
void
amr_ssd_cache_count_device_reads(int n)
{
	if (cache_ctl != NULL)
		pg_atomic_fetch_add_u64(&cache_ctl->device_reads, (uint64) n);
}

/*
 * Does the cache hold the image "word" names?  (No copy, no counting: the
 * scan uses it to leave cached leaves out of its batched reads.)
 */
bool
amr_ssd_cache_holds(uint32 leaf_id, uint64 word)
{
	uint32		slot_no;
	AmrSsdCacheSlot *cs = hinted_slot(leaf_id, &slot_no);

	return cs != NULL && (pg_atomic_read_u32(&cs->seq) & 1) == 0 &&
		cs->leaf_id == leaf_id && cs->word == word;
}

/*
 * Remember a copy of the SSD image "word" names.  The image must be one
 * this process wrote or one that passed amr_leaf_validate: lookups return
 * it without checking it again.  Best effort: gives up rather than wait.
 */
void
amr_ssd_cache_put(const AmrTree *t, uint32 leaf_id, uint64 word, const AmrLeaf *img)
{
	AmrLeafVolatile *v = &amr_store.leaves[leaf_id];
	uint32		nslots;
	uint32		tries;

	if (!cache_enabled() || AMR_WORD_TIER(word) != AMR_TIER_SSD ||
		amr_ssd_cache_holds(leaf_id, word))
		return;
	nslots = cache_ctl->nslots;

	/*
	 * The clock: a referenced slot gets a second chance; two sweeps find a
	 * victim unless every slot is being filled at once, and then the copy is
	 * not worth waiting for.
	 */
	for (tries = 0; tries < 2 * nslots + 1; tries++)
	{
		uint32		i = pg_atomic_fetch_add_u32(&cache_ctl->hand, 1) % nslots;
		AmrSsdCacheSlot *cs = &cache_slots[i];
		uint32		seq = pg_atomic_read_u32(&cs->seq);

		if (seq & 1)
			continue;
		if (pg_atomic_read_u32(&cs->referenced) != 0)
		{
			pg_atomic_write_u32(&cs->referenced, 0);
			continue;
		}
		if (!pg_atomic_compare_exchange_u32(&cs->seq, &seq, seq + 1))
			continue;
		/* ours (odd) until the next increment; readers of the old tag miss */
		cs->leaf_id = leaf_id;
		cs->tree_no = t->tree_no;
		cs->generation = t->generation;
		cs->word = word;
		{
			char	   *dst = cache_images + (Size) i * AMR_SLOT_SIZE;
			Size		len = Min(amr_leaf_image_bytes(img), (Size) AMR_SLOT_SIZE);

			/* the tail zeroed, as in a slot read from SSD */
			memcpy(dst, img, len);
			memset(dst + len, 0, AMR_SLOT_SIZE - len);
		}
		pg_atomic_write_u32(&cs->referenced, 1);
		pg_atomic_fetch_add_u32(&cs->seq, 1);	/* full barrier, then even */
		amr_counter_set(&v->ssd_cache_hint, i + 1);
		pg_atomic_fetch_add_u64(&cache_ctl->fills, 1);
		return;
	}
}

/*
 * The cache's cluster-wide counters since the server started (all 0 without
 * a cache): its size, images copied from it, images read from the slot
 * file, and images put in it.
 */
void
amr_ssd_cache_counters(uint64 *size_bytes, uint64 *hits, uint64 *device_reads,
					   uint64 *fills)
{
	*size_bytes = cache_ctl ? (uint64) cache_ctl->nslots * AMR_SLOT_SIZE : 0;
	*hits = cache_ctl ? pg_atomic_read_u64(&cache_ctl->hits) : 0;
	*device_reads = cache_ctl ? pg_atomic_read_u64(&cache_ctl->device_reads) : 0;
	*fills = cache_ctl ? pg_atomic_read_u64(&cache_ctl->fills) : 0;
}
