/*-------------------------------------------------------------------------
 *
 * amr_leafio.c
 *		Leaf storage for the AM glue: allocation of leaf ids and slots,
 *		resolving a leaf id through the Leaf Table (paper Algorithm 1), the
 *		access hook that maintains hotness, and the pins that keep VACUUM
 *		from outrunning index-only scans.
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include <math.h>

#include "access/xact.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "portability/instr_time.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/wait_event.h"

const char *
amr_index_name(Relation index, const AmrTree *t)
{
	if (index != NULL)
		return RelationGetRelationName(index);
	return psprintf("(tree %u)", t ? t->tree_no : 0);
}

void
amr_report_status(AmrStatus st, Relation index)
{
	const char *name = index ? RelationGetRelationName(index) : "(none)";

	switch (st)
	{
		case AMR_OK:
			return;
		case AMR_ERR_DRAM_FULL:
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("amrtree DRAM area is full (index \"%s\")", name),
					 errdetail("All %u inner nodes that fit in amrtree.dram_size = %d kB are in use.",
							   amr_store.nnodes, amr_dram_size_kb),
					 errhint("Raise amrtree.dram_size and restart the server.")));
			break;
		case AMR_ERR_PMEM_FULL:
			ereport(ERROR,
					(errcode(ERRCODE_DISK_FULL),
					 errmsg("amrtree PMEM pool is full (index \"%s\")", name),
					 errdetail("All %u leaf slots of the pool are in use.",
							   amr_store.pmem_nslots),
					 errhint("Raise amrtree.pmem_size and restart the server; the pool is enlarged at startup.")));
			break;
		case AMR_ERR_SSD_FULL:
			ereport(ERROR,
					(errcode(ERRCODE_DISK_FULL),
					 errmsg("amrtree SSD slot file is full (index \"%s\")", name),
					 errdetail("All %u slots of the SSD tier and all %u of the PMEM pool are in use.",
							   amr_store.ssd_nslots, amr_store.pmem_nslots),
					 errhint("Raise amrtree.ssd_size (or amrtree.pmem_size) and restart the server.")));
			break;
		case AMR_ERR_LEAF_IDS_FULL:
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("amrtree Leaf Table is full (index \"%s\")", name),
					 errdetail("All %u leaf ids are in use.", amr_store.lt_capacity),
					 errhint("Raise amrtree.pmem_size and restart the server; the pool is enlarged at startup.")));
			break;
		case AMR_ERR_TOO_TALL:
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("amrtree index \"%s\" would exceed %d levels", name, AMR_MAX_HEIGHT)));
			break;
	}
}

uint32
amr_alloc_leaf_id(Relation index)
{
	int64		id = amr_bitmap_alloc(amr_store.leaf_ids_used);

	if (id < 0)
		amr_report_status(AMR_ERR_LEAF_IDS_FULL, index);
	return (uint32) id;
}

uint32
amr_alloc_pmem_slot(Relation index)
{
	int64		slot = amr_bitmap_alloc(amr_store.pmem_used);

	if (slot < 0)
		amr_report_status(AMR_ERR_PMEM_FULL, index);
	return (uint32) slot;
}

/*
 * Resolve a leaf id to its PMEM image, for paths that modify PMEM leaves in
 * place.  Caller holds the leaf lock and knows the leaf is on PMEM.  The
 * image is checked before anyone reads entries from it, so a damaged leaf
 * raises an ERROR instead of returning garbage.
 */
AmrLeaf *
amr_leaf_resolve(Relation index, AmrTree *t, uint32 leaf_id, uint64 *word_out)
{
	uint64		word = amr_lt_word(&amr_store, leaf_id);
	AmrLeaf    *leaf;

	*word_out = word;
	if (AMR_WORD_TIER(word) != AMR_TIER_PMEM ||
		AMR_WORD_SLOT(word) >= amr_store.pmem_nslots)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("leaf %u of amrtree index \"%s\" has an invalid Leaf Table word %016llx",
						leaf_id, amr_index_name(index, t),
						(unsigned long long) word)));
	leaf = amr_pmem_slot(&amr_store, AMR_WORD_SLOT(word));
	amr_leaf_validate(index, t, leaf_id, word, leaf, false);
	return leaf;
}

void
amr_leaf_validate(Relation index, AmrTree *t, uint32 leaf_id, uint64 word,
				  const AmrLeaf *img, bool from_ssd)
{
	if (img->hdr.magic != AMR_LEAF_MAGIC || img->hdr.leaf_id != leaf_id ||
		img->hdr.tree_no != t->tree_no || img->hdr.nentries > AMR_LEAF_CAPACITY ||
		(from_ssd && img->hdr.version != AMR_WORD_VERSION(word)))
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("leaf %u of amrtree index \"%s\" is damaged",
						leaf_id, amr_index_name(index, t)),
				 errdetail("%s slot %u holds magic 0x%08x, leaf id %u, tree %u, version %u, %llu entries.",
						   from_ssd ? "SSD" : "PMEM", AMR_WORD_SLOT(word), img->hdr.magic,
						   img->hdr.leaf_id, img->hdr.tree_no, img->hdr.version,
						   (unsigned long long) img->hdr.nentries),
				 errhint("REINDEX the index.")));
	if (from_ssd && !amr_leaf_image_checksum_ok(img))
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("checksum mismatch in leaf %u of amrtree index \"%s\"",
						leaf_id, amr_index_name(index, t)),
				 errdetail("SSD slot %u of \"%s\" does not hold the image that was written there.",
						   AMR_WORD_SLOT(word), amr_ssd_path),
				 errhint("The SSD slot file is damaged: REINDEX the index.")));
}

/* ---- SSD I/O ---- */

static void
ssd_io_error(Relation index, const char *what, uint32 slot, int rc)
{
	errno = -rc;
	ereport(ERROR,
			(errcode_for_file_access(),
			 errmsg("could not %s SSD slot %u of \"%s\"%s%s%s: %m", what, slot,
					amr_ssd_path, index ? " (index \"" : "",
					index ? RelationGetRelationName(index) : "", index ? "\")" : "")));
}

void
amr_ssd_read_images(Relation index, const uint32 *slots, AmrLeaf **bufs, int n)
{
	int			rc;

	if (n == 0)
		return;
	amr_ssd_io.method = (AmrIoMethod) amr_io_method_setting;
	pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_READ);
	rc = amr_ssd_read_slots(&amr_ssd_io, slots, (void *const *) bufs, n);
	pgstat_report_wait_end();
	amr_ssd_cache_count_device_reads(n);
	if (rc < 0)
		ssd_io_error(index, "read", slots[0], rc);
}

/* The checksum, and bytes past the entries zeroed: they are written too. */
static void
seal_ssd_image(AmrLeaf *img)
{
	Assert(((uintptr_t) img % AMR_SLOT_SIZE) == 0);
	memset((char *) img + amr_leaf_image_bytes(img), 0,
		   AMR_SLOT_SIZE - amr_leaf_image_bytes(img));
	amr_leaf_image_set_checksum(img);
}

/*
 * Write a prepared image to a reserved slot and make it durable.  (Several
 * SSD images at once: amr_ssd_write_images, then amr_ssd_flush.)
 */
void
amr_tier_write(Relation index, uint32 tier, uint32 slot, AmrLeaf *img)
{
	int			rc;

	if (tier == AMR_TIER_PMEM)
	{
		img->hdr.flags &= ~AMR_LEAF_FLAG_CHECKSUM;
		amr_pmem_write_image(&amr_store, slot, img);
		return;
	}
	seal_ssd_image(img);
	amr_ssd_io.method = (AmrIoMethod) amr_io_method_setting;
	pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_WRITE);
	rc = amr_ssd_write_slot(&amr_ssd_io, slot, img, true);
	pgstat_report_wait_end();
	if (rc < 0)
		ssd_io_error(index, "write", slot, rc);
}

/*
 * Write n images to reserved SSD slots with one submission, not synced:
 * call amr_ssd_flush() before publishing any of them.
 */
void
amr_ssd_write_images(Relation index, const uint32 *slots, AmrLeaf **imgs, int n)
{
	int			rc;
	int			i;

	if (n == 0)
		return;
	for (i = 0; i < n; i++)
		seal_ssd_image(imgs[i]);
	amr_ssd_io.method = (AmrIoMethod) amr_io_method_setting;
	pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_WRITE);
	rc = amr_ssd_write_slots(&amr_ssd_io, slots, (void *const *) imgs, n);
	pgstat_report_wait_end();
	if (rc < 0)
		ssd_io_error(index, "write", slots[0], rc);
}

void
amr_ssd_flush(Relation index)
{
	int			rc;

	pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_SYNC);
	rc = amr_ssd_sync(&amr_ssd_io);
	pgstat_report_wait_end();
	if (rc < 0)
	{
		errno = -rc;
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not fsync \"%s\": %m", amr_ssd_path)));
	}
}

/* A 4 KiB-aligned leaf buffer (O_DIRECT), in the current memory context. */
AmrLeaf *
amr_alloc_leaf_buffer(void)
{
	char	   *p = palloc(2 * AMR_SLOT_SIZE);

	return (AmrLeaf *) TYPEALIGN(AMR_SLOT_SIZE, p);
}

/*
 * Copy the current image of a leaf into buf (4 KiB aligned), from whichever
 * tier it is on (paper Algorithm 1).  Returns its Leaf Table word, or 0 when
 * the leaf no longer belongs to the tree.  If nsn/rightlink are given, they
 * receive the leaf's split links, read under the same lock as the word.
 *
 * PMEM images and DRAM copies are copied under the leaf lock in shared
 * mode.  SSD images come from the SSD cache if it holds the image the word
 * names, else are read without any lock held: they are immutable while the
 * word references them, so a word unchanged after the read proves the copy
 * good (versions only grow: no ABA); otherwise the leaf moved and we read
 * again.  Callers must not hold the leaf lock.
 */
uint64
amr_leaf_copy(Relation index, AmrTree *t, uint32 leaf_id, AmrLeaf *buf,
			  uint64 *nsn, uint32 *rightlink)
{
	AmrStore   *s = &amr_store;
	AmrLeafVolatile *v = &s->leaves[leaf_id];

	for (;;)
	{
		uint64		word;
		uint32		slot;

		LWLockAcquire(amr_leaf_lock(leaf_id), LW_SHARED);
		word = amr_lt_word(s, leaf_id);
		if (!amr_lt_owned_by(s, leaf_id, word, t->tree_no, t->generation))
		{
			LWLockRelease(amr_leaf_lock(leaf_id));
			return 0;
		}
		if (nsn)
			*nsn = v->nsn;
		if (rightlink)
			*rightlink = v->rightlink;
		if (v->cache_slot >= 0)
		{
			const AmrLeaf *c = &amr_leaf_cache[v->cache_slot];

			memcpy(buf, c, amr_leaf_image_bytes(c));
			LWLockRelease(amr_leaf_lock(leaf_id));
			return word;
		}
		if (AMR_WORD_TIER(word) == AMR_TIER_PMEM)
		{
			AmrLeaf    *leaf = amr_leaf_resolve(index, t, leaf_id, &word);

			memcpy(buf, leaf, amr_leaf_image_bytes(leaf));
			LWLockRelease(amr_leaf_lock(leaf_id));
			return word;
		}
		LWLockRelease(amr_leaf_lock(leaf_id));

		slot = AMR_WORD_SLOT(word);
		if (slot >= s->ssd_nslots)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("leaf %u of amrtree index \"%s\" has an invalid Leaf Table word %016llx",
							leaf_id, amr_index_name(index, t), (unsigned long long) word)));
		if (amr_ssd_cache_get(t, leaf_id, word, buf))
			return word;
		amr_ssd_read_images(index, &slot, &buf, 1);
		if (amr_lt_word(s, leaf_id) != word)
			continue;			/* moved or rewritten while we read: again */
		amr_leaf_validate(index, t, leaf_id, word, buf, true);
		amr_ssd_cache_put(t, leaf_id, word, buf);
		return word;
	}
}

/* ---- placement of new images ---- */

uint64
amr_budget_leaves(const AmrTree *t, uint64 extra_leaves)
{
	uint64		leaves = __atomic_load_n(&t->nleaves, __ATOMIC_RELAXED) + extra_leaves;

	if (!t->tiering || amr_store.ssd_used == NULL)
		return UINT64_MAX;
	switch ((AmrBudgetKind) t->budget_kind)
	{
		case AMR_BUDGET_FRACTION:
			return (uint64) floor(t->budget_value * (double) leaves + 1e-9);
		case AMR_BUDGET_BYTES:
			return (uint64) (t->budget_value / AMR_SLOT_SIZE);
		default:
			return UINT64_MAX;
	}
}

/*
 * Tier for new images that add "new_pmem" leaves to PMEM if put there.
 * Within the budget: PMEM.  Beyond it:
 *
 *	defer   PMEM anyway; the tier manager brings the index back within its
 *			budget at its next scan (demoting the coldest leaves in batches,
 *			one sync per batch), and amrtree_settle() exactly.  An insert never
 *			waits for SSD I/O: a 4 KiB O_DIRECT write and fdatasync take
 *			hundreds of microseconds on the machines we measured, an append a
 *			microsecond or two.  Waking the tier manager at every excess was
 *			tried and made it demote, continuously, leaves that the inserts
 *			were about to write again.
 *	strict  SSD: a hard cap between scans, paid for with an SSD write and
 *			sync inside the insert.
 *
 * Without tiering, or without an SSD tier, always PMEM.
 */
uint32
amr_new_image_tier(const AmrTree *t, int new_pmem, int new_leaves)
{
	uint64		budget = amr_budget_leaves(t, (uint64) new_leaves);

	if (budget == UINT64_MAX ||
		__atomic_load_n(&t->pmem_leaves, __ATOMIC_RELAXED) + (uint64) new_pmem <= budget)
		return AMR_TIER_PMEM;
	if (amr_budget_on_insert == AMR_BUDGET_INSERT_STRICT)
		return AMR_TIER_SSD;
	return AMR_TIER_PMEM;
}

/* ---- DRAM copies (rule R6) ---- */

/* Caller holds the leaf exclusively; image is its current image. */
bool
amr_cache_pin(AmrTree *t, uint32 leaf_id, const AmrLeaf *image)
{
	AmrLeafVolatile *v = &amr_store.leaves[leaf_id];
	int64		c;

	if (v->cache_slot >= 0 || amr_leaf_cache_n == 0)
		return v->cache_slot >= 0;
	c = amr_bitmap_alloc(amr_leaf_cache_used);
	if (c < 0)
		return false;
	memcpy(&amr_leaf_cache[c], image, amr_leaf_image_bytes(image));
	v->cache_slot = (int32) c;
	__atomic_add_fetch(&t->dram_leaves, 1, __ATOMIC_RELAXED);
	return true;
}

void
amr_cache_unpin(AmrTree *t, uint32 leaf_id)
{
	AmrLeafVolatile *v = &amr_store.leaves[leaf_id];

	if (v->cache_slot < 0)
		return;
	amr_bitmap_clear(amr_leaf_cache_used, (uint64) v->cache_slot);
	v->cache_slot = -1;
	__atomic_sub_fetch(&t->dram_leaves, 1, __ATOMIC_RELAXED);
}

/* Write-through: after any change of a pinned leaf's image (leaf held exclusively). */
void
amr_cache_refresh(uint32 leaf_id, const AmrLeaf *image)
{
	AmrLeafVolatile *v = &amr_store.leaves[leaf_id];

	if (v->cache_slot >= 0)
		memcpy(&amr_leaf_cache[v->cache_slot], image, amr_leaf_image_bytes(image));
}

/*
 * Count an access for the hotness score (paper 3.5, Algorithm 2).  One
 * relaxed atomic increment; the tier manager folds the counts into the
 * decayed score at its next scan (see core/amr_policy.h).
 */
void
amr_leaf_access(uint32 leaf_id, bool write)
{
	AmrLeafVolatile *v = &amr_store.leaves[leaf_id];

	if (write)
		__atomic_add_fetch(&v->writes_pending, 1, __ATOMIC_RELAXED);
	else
		__atomic_add_fetch(&v->reads_pending, 1, __ATOMIC_RELAXED);
}

/* ---- pins ---- */

typedef struct LocalPin
{
	uint32		tree_no;
	uint32		leaf_id;
	SubTransactionId subid;
} LocalPin;

static LocalPin *local_pins = NULL;
static int	n_local_pins = 0;
static int	max_local_pins = 0;

void
amr_pin_leaf(AmrTree *t, uint32 leaf_id)
{
	if (n_local_pins == max_local_pins)
	{
		int			newmax = max_local_pins ? max_local_pins * 2 : 8;

		if (local_pins == NULL)
			local_pins = MemoryContextAlloc(TopMemoryContext, sizeof(LocalPin) * newmax);
		else
			local_pins = repalloc(local_pins, sizeof(LocalPin) * newmax);
		max_local_pins = newmax;
	}
	local_pins[n_local_pins].tree_no = t->tree_no;
	local_pins[n_local_pins].leaf_id = leaf_id;
	local_pins[n_local_pins].subid = GetCurrentSubTransactionId();
	n_local_pins++;
	__atomic_add_fetch(&amr_store.leaves[leaf_id].pins, 1, __ATOMIC_SEQ_CST);
	__atomic_add_fetch(&t->pinned, 1, __ATOMIC_SEQ_CST);
}

static void
drop_pin(int i)
{
	LocalPin	p = local_pins[i];

	__atomic_sub_fetch(&amr_store.leaves[p.leaf_id].pins, 1, __ATOMIC_SEQ_CST);
	__atomic_sub_fetch(&amr_store.trees[p.tree_no].pinned, 1, __ATOMIC_SEQ_CST);
	local_pins[i] = local_pins[--n_local_pins];
}

void
amr_unpin_leaf(AmrTree *t, uint32 leaf_id)
{
	int			i;

	for (i = n_local_pins - 1; i >= 0; i--)
	{
		if (local_pins[i].tree_no == t->tree_no && local_pins[i].leaf_id == leaf_id)
		{
			drop_pin(i);
			return;
		}
	}
}

/* Release pins of aborted (sub)transactions; all of them at top level. */
void
amr_pins_release_all(SubTransactionId subid)
{
	int			i;

	if (amr_shared == NULL)
		return;
	for (i = n_local_pins - 1; i >= 0; i--)
		if (subid == InvalidSubTransactionId || local_pins[i].subid >= subid)
			drop_pin(i);
}

/*
 * Wait until no scan holds a pin on the leaf.  Called by VACUUM after it has
 * switched a leaf to an image without the dead entries: a scan that copied
 * the old image may still hand out one of those TIDs, and an index-only
 * scan would trust the visibility map for it once VACUUM has marked the heap
 * page all-visible.  Pins are held only while a scan returns one leaf's
 * matches, so the wait is short.
 */
void
amr_wait_for_unpin(AmrTree *t, uint32 leaf_id)
{
	while (__atomic_load_n(&amr_store.leaves[leaf_id].pins, __ATOMIC_SEQ_CST) > 0)
	{
		CHECK_FOR_INTERRUPTS();
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 1L, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
