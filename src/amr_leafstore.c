/*-------------------------------------------------------------------------
 *
 * amr_leafstore.c
 *		The leaf store (see amr_leafstore.h): reading leaves from whichever
 *		tier holds them, taking slots, writing images, switching Leaf Table
 *		words and what follows a switch, DRAM copies (rule R6), and access
 *		counting for the hotness score.
 *
 *-------------------------------------------------------------------------
 */
#include "amr_leafstore.h"
#include "amr_wal.h"

#include "access/xlog.h"
#include "miscadmin.h"
#include "utils/rel.h"

/* ---- errors ---- */

const char *
amr_index_name(Relation index, const AmrTree *t)
{
	if (index != NULL)
		return RelationGetRelationName(index);
	return psprintf("(tree %u)", t ? t->tree_no : 0);
}

int
amr_errhint_reindex(void)
{
	/* a standby cannot rebuild an index; replaying the primary's REINDEX does */
	if (RecoveryInProgress())
		return errhint("REINDEX the index on the primary; this server follows.");
	return errhint("REINDEX the index.");
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
					 errdetail("%llu of the pool's %u leaf slots are in use; the last %d are kept for changes that free a slot for each one they take (VACUUM, moves between tiers).",
							   (unsigned long long) amr_bitmap_count(amr_store.pmem_used),
							   amr_store.pmem_nslots, AMR_SLOT_RESERVE),
					 errhint("Raise amrtree.pmem_size and restart the server; the pool is enlarged at startup.")));
			break;
		case AMR_ERR_SSD_FULL:
			ereport(ERROR,
					(errcode(ERRCODE_DISK_FULL),
					 errmsg("amrtree SSD slot file is full (index \"%s\")", name),
					 errdetail("%llu of the SSD tier's %u slots and %llu of the PMEM pool's %u are in use; the last %d of each are kept for changes that free a slot for each one they take (VACUUM, moves between tiers).",
							   (unsigned long long) (amr_store.ssd_used ?
													 amr_bitmap_count(amr_store.ssd_used) : 0),
							   amr_store.ssd_nslots,
							   (unsigned long long) amr_bitmap_count(amr_store.pmem_used),
							   amr_store.pmem_nslots, AMR_SLOT_RESERVE),
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

/* ---- buffers ---- */

AmrLeaf *
amr_alloc_leaf_buffer(void)
{
	char	   *p = palloc(2 * AMR_SLOT_SIZE);

	return (AmrLeaf *) TYPEALIGN(AMR_SLOT_SIZE, p);
}

/* ---- placement of new images ---- */

uint64
amr_tree_budget_leaves(const AmrTree *t, uint64 extra_leaves)
{
	if (!t->tiering || amr_store.ssd_used == NULL)
		return UINT64_MAX;
	return amr_budget_leaves((AmrBudgetKind) t->budget_kind, t->budget_value,
							 amr_counter_read(&t->nleaves) + extra_leaves);
}

uint32
amr_tree_new_image_tier(const AmrTree *t, int new_pmem, int new_leaves)
{
	return amr_new_image_tier(amr_tree_budget_leaves(t, (uint64) new_leaves),
							  amr_counter_read(&t->pmem_leaves), new_pmem,
							  amr_budget_on_insert == AMR_BUDGET_INSERT_STRICT);
}

/* ---- slots ---- */

bool
amr_try_take_slot(AmrSlotPurpose purpose, uint32 tier, uint32 *tier_out, uint32 *slot_out)
{
	return amr_slot_take(&amr_store, purpose, tier, tier_out, slot_out) == AMR_OK;
}

void
amr_take_slot(Relation index, AmrSlotPurpose purpose, uint32 tier, uint32 *tier_out,
			  uint32 *slot_out)
{
	AmrStatus	st = amr_slot_take(&amr_store, purpose, tier, tier_out, slot_out);

	if (st != AMR_OK)
		amr_report_status(st, index);
}

void
amr_give_back_slot(uint32 tier, uint32 slot)
{
	amr_slot_give_back(&amr_store, tier, slot);
}

uint32
amr_take_leaf_id(Relation index)
{
	int64		id = amr_bitmap_alloc(amr_store.leaf_ids_used);

	if (id < 0)
		amr_report_status(AMR_ERR_LEAF_IDS_FULL, index);
	return (uint32) id;
}

/* ---- reading ---- */

void
amr_leaf_validate(Relation index, const AmrTree *t, uint32 leaf_id, uint64 word,
				  const AmrLeaf *img, bool from_ssd)
{
	if (img->hdr.magic != AMR_LEAF_MAGIC || img->hdr.leaf_id != leaf_id ||
		img->hdr.tree_no != t->tree_no || img->hdr.nentries > AMR_LEAF_CAPACITY ||
		(from_ssd && img->hdr.version != AMR_WORD_VERSION(word)))
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("leaf %u of amrtree index \"%s\" is damaged",
						leaf_id, amr_index_name(index, t)),
				 from_ssd ?
				 errdetail("SSD slot %u holds magic 0x%08x, leaf id %u, tree %u, version %u, %llu entries.",
						   AMR_WORD_SLOT(word), img->hdr.magic, img->hdr.leaf_id,
						   img->hdr.tree_no, img->hdr.version,
						   (unsigned long long) img->hdr.nentries) :
				 errdetail("PMEM slot %u holds magic 0x%08x, leaf id %u, tree %u, version %u, %llu entries.",
						   AMR_WORD_SLOT(word), img->hdr.magic, img->hdr.leaf_id,
						   img->hdr.tree_no, img->hdr.version,
						   (unsigned long long) img->hdr.nentries),
				 amr_errhint_reindex()));
	if (from_ssd && !amr_leaf_image_checksum_ok(img))
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("checksum mismatch in leaf %u of amrtree index \"%s\"",
						leaf_id, amr_index_name(index, t)),
				 errdetail("SSD slot %u of \"%s\" does not hold the image that was written there.",
						   AMR_WORD_SLOT(word), amr_ssd_path),
				 amr_errhint_reindex()));
}

static void
invalid_word(Relation index, const AmrTree *t, uint32 leaf_id, uint64 word)
{
	ereport(ERROR,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("leaf %u of amrtree index \"%s\" has an invalid Leaf Table word %016llx",
					leaf_id, amr_index_name(index, t), (unsigned long long) word)));
}

AmrLeaf *
amr_leaf_pmem_image(Relation index, AmrTree *t, uint32 leaf_id, uint64 *word_out)
{
	uint64		word = amr_lt_word(&amr_store, leaf_id);
	AmrLeaf    *leaf;

	*word_out = word;
	if (AMR_WORD_TIER(word) != AMR_TIER_PMEM ||
		AMR_WORD_SLOT(word) >= amr_store.pmem_nslots)
		invalid_word(index, t, leaf_id, word);
	leaf = amr_pmem_slot(&amr_store, AMR_WORD_SLOT(word));
	amr_leaf_validate(index, t, leaf_id, word, leaf, false);
	return leaf;
}

/*
 * Does reading this leaf take a device read?  Not if it is on PMEM, held in
 * DRAM by rule R6, or in the SSD cache.
 */
static bool
needs_device_read(uint32 leaf_id, uint64 word)
{
	return AMR_WORD_TIER(word) == AMR_TIER_SSD &&
		amr_store.leaves[leaf_id].dram_copy < 0 &&
		!amr_ssd_cache_holds(leaf_id, word);
}

/*
 * An SSD image, from the SSD cache or the device, read with no lock held:
 * SSD images are immutable while the word references them, so the copy is
 * good if the word is unchanged afterwards (versions only grow: no ABA).
 * Returns false if the leaf moved meanwhile (the caller reads it again).
 */
static bool
read_ssd_image(Relation index, AmrTree *t, uint32 leaf_id, uint64 word, AmrLeaf *buf)
{
	uint32		slot = AMR_WORD_SLOT(word);

	if (slot >= amr_store.ssd_nslots)
		invalid_word(index, t, leaf_id, word);
	if (amr_ssd_cache_get(t, leaf_id, word, buf))
		return true;
	amr_ssd_read_images(index, &slot, &buf, 1);
	if (amr_lt_word(&amr_store, leaf_id) != word)
		return false;
	amr_leaf_validate(index, t, leaf_id, word, buf, true);
	amr_ssd_cache_put(t, leaf_id, word, buf);
	return true;
}

static AmrLeaf *read_ahead_image(AmrReadAhead *ra, uint32 leaf_id, uint64 word);

uint64
amr_leaf_read(Relation index, AmrTree *t, uint32 leaf_id, AmrLeaf *buf,
			  uint64 *nsn, uint32 *rightlink)
{
	return amr_leaf_read_ahead(index, t, leaf_id, buf, nsn, rightlink, NULL);
}

/*
 * An image read ahead is copied as it is: it does not go into the SSD
 * cache, so a pass over the whole index (VACUUM) does not push out what
 * scans keep there, as VACUUM's buffer ring spares shared buffers.
 */
uint64
amr_leaf_read_ahead(Relation index, AmrTree *t, uint32 leaf_id, AmrLeaf *buf,
					uint64 *nsn, uint32 *rightlink, AmrReadAhead *ra)
{
	AmrStore   *s = &amr_store;
	AmrLeafVolatile *v = &s->leaves[leaf_id];

	for (;;)
	{
		uint64		word;

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
		if (v->dram_copy >= 0 || AMR_WORD_TIER(word) == AMR_TIER_PMEM)
		{
			const AmrLeaf *src = v->dram_copy >= 0 ? &amr_leaf_cache[v->dram_copy]
			: amr_leaf_pmem_image(index, t, leaf_id, &word);

			memcpy(buf, src, amr_leaf_image_bytes(src));
			LWLockRelease(amr_leaf_lock(leaf_id));
			return word;
		}
		LWLockRelease(amr_leaf_lock(leaf_id));
		if (ra != NULL)
		{
			const AmrLeaf *ahead = read_ahead_image(ra, leaf_id, word);

			if (ahead != NULL)
			{
				amr_leaf_validate(index, t, leaf_id, word, ahead, true);
				memcpy(buf, ahead, amr_leaf_image_bytes(ahead));
				return word;
			}
		}
		if (read_ssd_image(index, t, leaf_id, word, buf))
			return word;
	}
}

/*
 * Most scans never read ahead (every leaf they read is on PMEM, in DRAM or
 * in the SSD cache), so the buffers wait for the first read-ahead: 68 kB
 * allocated and freed by every query made glibc's malloc move its heap top
 * up and down (brk, and page faults on the new pages), a tenth of a small
 * KNN query's time.
 */
void
amr_readahead_init(AmrReadAhead *ra)
{
	memset(ra->bufs, 0, sizeof(ra->bufs));
	ra->cxt = CurrentMemoryContext;
	ra->n = 0;
}

static void
readahead_alloc_buffers(AmrReadAhead *ra)
{
	char	   *p = MemoryContextAlloc(ra->cxt, (AMR_READAHEAD_MAX + 1) * AMR_SLOT_SIZE);
	int			i;

	/* O_DIRECT reads: aligned to the slot size */
	p = (char *) TYPEALIGN(AMR_SLOT_SIZE, p);
	for (i = 0; i < AMR_READAHEAD_MAX; i++)
		ra->bufs[i] = (AmrLeaf *) (p + (Size) i * AMR_SLOT_SIZE);
}

void
amr_readahead_reset(AmrReadAhead *ra)
{
	ra->n = 0;
}

static AmrLeaf *
read_ahead_image(AmrReadAhead *ra, uint32 leaf_id, uint64 word)
{
	int			i;

	for (i = 0; i < ra->n; i++)
		if (ra->ids[i] == leaf_id && ra->words[i] == word)
			return ra->bufs[i];
	return NULL;
}

void
amr_readahead(AmrReadAhead *ra, Relation index, const uint32 *next, int nnext)
{
	AmrStore   *s = &amr_store;
	uint32		slots[AMR_READAHEAD_MAX];
	uint64		word;
	int			i;
	int			n = 0;

	if (s->ssd_used == NULL || nnext == 0)
		return;
	/* only when the next leaf must come from the device, and is not here */
	word = amr_lt_word(s, next[0]);
	if (!needs_device_read(next[0], word) || read_ahead_image(ra, next[0], word) != NULL)
		return;
	/* words read without locks: an image is used only if its word holds */
	for (i = 0; i < nnext && n < AMR_READAHEAD_MAX; i++)
	{
		word = amr_lt_word(s, next[i]);
		if (!needs_device_read(next[i], word) || AMR_WORD_SLOT(word) >= s->ssd_nslots)
			continue;
		ra->ids[n] = next[i];
		ra->words[n] = word;
		slots[n] = AMR_WORD_SLOT(word);
		n++;
	}
	ra->n = 0;
	if (n > 1)
	{
		if (ra->bufs[0] == NULL)
			readahead_alloc_buffers(ra);
		amr_ssd_read_images(index, slots, ra->bufs, n);
		ra->n = n;
	}
}

const AmrLeaf *
amr_leaf_read_for_scan(Relation index, AmrTree *t, uint32 generation, uint32 leaf_id,
					   uint64 start_nsn, AmrReadAhead *ra, AmrLeaf *buf,
					   AmrLeafCopyFn copy_fn, void *copy_arg, uint32 *follow)
{
	AmrStore   *s = &amr_store;
	AmrLeafVolatile *v = &s->leaves[leaf_id];
	const AmrLeaf *img = buf;
	uint64		word;

retry:
	*follow = AMR_INVALID_LEAF;
	LWLockAcquire(amr_leaf_lock(leaf_id), LW_SHARED);
	word = amr_lt_word(s, leaf_id);
	if (!amr_lt_owned_by(s, leaf_id, word, t->tree_no, generation))
	{
		LWLockRelease(amr_leaf_lock(leaf_id));
		return NULL;
	}
	/* split after the scan collected its leaves: the moved entries are right */
	if (v->nsn > start_nsn && v->rightlink != AMR_INVALID_LEAF)
		*follow = v->rightlink;
	if (v->dram_copy >= 0 || AMR_WORD_TIER(word) == AMR_TIER_PMEM)
	{
		const AmrLeaf *src = v->dram_copy >= 0 ? &amr_leaf_cache[v->dram_copy]
		: amr_leaf_pmem_image(index, t, leaf_id, &word);

		if (copy_fn != NULL)
			copy_fn(src, buf, copy_arg);
		else
			memcpy(buf, src, amr_leaf_image_bytes(src));
		LWLockRelease(amr_leaf_lock(leaf_id));
	}
	else
	{
		AmrLeaf    *ahead;

		LWLockRelease(amr_leaf_lock(leaf_id));
		AMR_FAULT_POINT("scan:before_ssd_read");	/* a pause, for t/032 */
		ahead = read_ahead_image(ra, leaf_id, word);
		if (ahead != NULL)
		{
			amr_leaf_validate(index, t, leaf_id, word, ahead, true);
			amr_ssd_cache_put(t, leaf_id, word, ahead);
			img = ahead;
		}
		else if (!read_ssd_image(index, t, leaf_id, word, buf))
		{
			/*
			 * The leaf moved or was rewritten while the lock was not held.
			 * Start over rather than read the new image alone: if it was a
			 * split, its right link is what leads to the moved entries.
			 */
			CHECK_FOR_INTERRUPTS();
			goto retry;
		}
	}
	amr_leaf_count_access(leaf_id, false);
	return img;
}

/* ---- writing ---- */

void
amr_leaf_write_image(Relation index, uint32 tier, uint32 slot, AmrLeaf *img)
{
	if (tier == AMR_TIER_PMEM)
	{
		img->hdr.flags &= ~AMR_LEAF_FLAG_CHECKSUM;
		amr_pmem_write_image(&amr_store, slot, img);
		return;
	}
	amr_ssd_write_images(index, &slot, &img, 1, true);
}

void
amr_leaf_write_ssd_batch(Relation index, const uint32 *slots, AmrLeaf **imgs, int n)
{
	amr_ssd_write_images(index, slots, imgs, n, false);
	amr_ssd_flush(index);
}

/*
 * Return the slot a leaf's old word referenced -- unless the leaf was
 * suspect (its word named another leaf's slot in a torn copy of the pool,
 * see AMR_LEAF_VOLATILE_SUSPECT): that slot is not its to give.
 */
static void
release_old_slot(uint32 leaf_id, uint64 old_word)
{
	AmrLeafVolatile *v = &amr_store.leaves[leaf_id];

	if (v->flags & AMR_LEAF_VOLATILE_SUSPECT)
	{
		v->flags &= ~AMR_LEAF_VOLATILE_SUSPECT;
		return;
	}
	amr_free_word_slot(&amr_store, old_word);
}

uint64
amr_leaf_switch(Relation index, AmrTree *t, uint32 leaf_id, uint32 tier, uint32 slot,
				const AmrFBox *mbr, const AmrLeaf *img, bool write, AmrSwitchLog how)
{
	AmrStore   *s = &amr_store;
	XLogRecPtr	lsn = InvalidXLogRecPtr;
	bool		wanted = how != AMR_LOG_NONE && amr_wal_wanted(t, index);
	bool		logged = false;
	uint64		old;

	START_CRIT_SECTION();
	if (wanted)
	{
		/*
		 * Held before deciding, as the append and dead-mark paths do: a move
		 * left unlogged because the leaf has an image since the redo pointer
		 * this backend saw is then either waited for by the write-back fence
		 * of a checkpoint that began meanwhile, or decided after that
		 * checkpoint's redo pointer is visible (and logged whole).
		 */
		amr_wal_hold_checkpoint();
		logged = how == AMR_LOG_REWRITE || amr_wal_needs_image(leaf_id);
	}
	if (logged)
	{
		lsn = amr_wal_images(t,
							 how == AMR_LOG_REWRITE ? AMR_IMAGE_REWRITE : AMR_IMAGE_MOVE,
							 1, &leaf_id, &img, NULL);
		AMR_FAULT_POINT("switch:after_logged");
		if (how == AMR_LOG_MOVE)
			AMR_FAULT_POINT("move:after_logged");	/* a pause, for t/023 */
	}
	if (amr_fault_hook != NULL)
	{
		/*
		 * Tests only: what amr_lt_switch persists before the word, then a
		 * crash point between the two (the Leaf Table count of an image that
		 * was never published; crash recovery's prune step repairs it, see
		 * amr_reconcile.c).
		 */
		s->lt[leaf_id].entries = (uint16) amr_leaf_live_entries(img);
		s->lt[leaf_id].lsn_hint = amr_lsn_hint_raise(s->lt[leaf_id].lsn_hint, img, lsn);
		amr_persist(&s->lt[leaf_id], sizeof(AmrLeafTableEntry));
		AMR_FAULT_POINT("switch:count_written");
	}
	old = amr_lt_switch(s, leaf_id, tier, slot, mbr, img, lsn);
	if (wanted)
		amr_wal_release_checkpoint();
	END_CRIT_SECTION();

	/* no reader can be reading the old slot: we hold the leaf exclusively */
	release_old_slot(leaf_id, old);
	amr_leaf_refresh_copy(leaf_id, img);
	/* a new SSD image is the likeliest to be read again soon */
	if (tier == AMR_TIER_SSD)
		amr_ssd_cache_put(t, leaf_id, amr_lt_word(s, leaf_id), img);
	if (write)
		amr_leaf_count_access(leaf_id, true);
	return old;
}

/* Scratch image for logging a leaf whole from inside a critical section. */
static AmrLeaf wal_image;

/*
 * Log the leaf whole as an append of e at pos leaves it.  With lsn invalid
 * (the entry's own record is this one) the entry is marked fresh and replay
 * stamps it with the record's end; else it carries lsn.
 */
static XLogRecPtr
log_leaf_with_entry(const AmrTree *t, uint32 leaf_id, const AmrLeaf *leaf, int pos,
					bool adds, const AmrLeafEntry *e, XLogRecPtr lsn)
{
	const AmrLeaf *img = &wal_image;
	uint16		fresh = (uint16) pos;

	memcpy(&wal_image, leaf, amr_leaf_image_bytes(leaf));
	wal_image.entries[pos] = *e;
	wal_image.entries[pos].insert_lsn = lsn;
	if (adds)
		wal_image.hdr.nentries++;
	return amr_wal_images(t, AMR_IMAGE_FULL, 1, &leaf_id, &img,
						  XLogRecPtrIsInvalid(lsn) ? &fresh : NULL);
}

/* Log the leaf whole as dead marks at pos[0..n-1] leave it. */
static XLogRecPtr
log_leaf_with_marks(const AmrTree *t, uint32 leaf_id, const AmrLeaf *leaf,
					const uint16 *pos, int n)
{
	const AmrLeaf *img = &wal_image;
	int			i;

	memcpy(&wal_image, leaf, amr_leaf_image_bytes(leaf));
	for (i = 0; i < n; i++)
		wal_image.entries[pos[i]].flags |= AMR_ENTRY_FLAG_DEAD;
	return amr_wal_images(t, AMR_IMAGE_FULL, 1, &leaf_id, &img, NULL);
}

void
amr_leaf_append(Relation index, AmrTree *t, uint32 leaf_id, AmrLeaf *leaf,
				const AmrLeafEntry *e, const AmrFBox *box, int dead_pos)
{
	AmrLeafEntry stamped = *e;
	bool		logged = amr_wal_wanted(t, index);
	int			pos = dead_pos >= 0 ? dead_pos : (int) leaf->hdr.nentries;

	START_CRIT_SECTION();
	if (logged)
	{
		amr_wal_hold_checkpoint();
		if (amr_wal_needs_image(leaf_id))
			stamped.insert_lsn = log_leaf_with_entry(t, leaf_id, leaf, pos, dead_pos < 0, e,
													 InvalidXLogRecPtr);
		else
		{
			AMR_FAULT_POINT("append:after_decision");	/* a pause, for t/029 */
			stamped.insert_lsn = amr_wal_append(t, leaf_id, leaf->hdr.version, pos, e);
			/* a checkpoint slipped in between the look and the record */
			if (amr_wal_delta_came_first(leaf_id))
				(void) log_leaf_with_entry(t, leaf_id, leaf, pos, dead_pos < 0, e,
										   stamped.insert_lsn);
		}
		AMR_FAULT_POINT("append:after_logged");
		AMR_FAULT_POINT("append:before_store"); /* a pause, for t/024 */
	}

	/*
	 * A logged entry carries its record's end as its WAL position: after a
	 * crash, an entry whose record did not survive is pruned, which also
	 * covers its heap tuple (logged before), and replay recognises an entry
	 * it already put in (amr_walredo.c).
	 */
	if (dead_pos < 0)
		amr_leaf_append_pmem(&amr_store, leaf_id, leaf, &stamped, box);
	else
		amr_leaf_reuse_dead_pmem(&amr_store, leaf_id, leaf, dead_pos, &stamped, box);
	if (logged)
		amr_wal_release_checkpoint();
	END_CRIT_SECTION();
	amr_leaf_refresh_copy(leaf_id, leaf);
	amr_leaf_count_access(leaf_id, true);
}

void
amr_leaf_mark_dead_many(Relation index, AmrTree *t, uint32 leaf_id, AmrLeaf *leaf,
						const uint16 *pos, int n)
{
	bool		logged = n > 0 && amr_wal_wanted(t, index);
	XLogRecPtr	lsn;
	int			i;

	START_CRIT_SECTION();
	if (logged)
	{
		amr_wal_hold_checkpoint();
		if (amr_wal_needs_image(leaf_id))
			lsn = log_leaf_with_marks(t, leaf_id, leaf, pos, n);
		else
		{
			lsn = amr_wal_mark_dead(t, leaf_id, leaf->hdr.version, pos, n);
			/* a checkpoint slipped in between the look and the record */
			if (amr_wal_delta_came_first(leaf_id))
				lsn = log_leaf_with_marks(t, leaf_id, leaf, pos, n);
		}

		/*
		 * Stamped before the marks are made: if the record does not reach
		 * durable WAL, crash recovery finds the leaf by its stamp and logs it
		 * whole, or a standby would keep these entries live -- and hand their
		 * boxes' queries whatever rows later take their heap slots.
		 */
		amr_lt_stamp(&amr_store, leaf_id, lsn);
		AMR_FAULT_POINT("vacuum:after_marks_logged");	/* a pause, for t/024 */
		AMR_FAULT_POINT("vacuum:before_marks_stored");
	}
	/* independent 2-byte stores: one msync for the leaf on a disk pool */
	amr_persist_batch_begin();
	for (i = 0; i < n; i++)
		amr_leaf_mark_dead_pmem(leaf, pos[i]);
	amr_persist_batch_end();
	if (logged)
		amr_wal_release_checkpoint();
	END_CRIT_SECTION();
	amr_leaf_refresh_copy(leaf_id, leaf);
}

void
amr_leaf_mark_dead(AmrLeaf *leaf, int pos)
{
	amr_leaf_mark_dead_pmem(leaf, pos);
}

void
amr_leaf_publish(AmrTree *t, uint32 leaf_id, uint32 tier, uint32 slot, const AmrLeaf *img,
				 const AmrFBox *mbr, bool nulls)
{
	AmrStore   *s = &amr_store;

	amr_lt_publish_new(s, leaf_id, t->tree_no, t->generation,
					   nulls ? AMR_LT_FLAG_NULLS : 0, AMR_INVALID_LEAF, 0,
					   tier, slot, mbr, img, 0);
	amr_leaf_volatile_reset(&s->leaves[leaf_id]);
}

void
amr_leaf_first_commit(Relation index, AmrTree *t, const AmrLeafEntry *e, const AmrLeaf *img,
					  bool nulls, AmrReservation *r)
{
	uint32		leaf_id = r->new_leaf;
	uint32		tier = r->tier_left;
	XLogRecPtr	lsn = InvalidXLogRecPtr;
	bool		logged = amr_wal_wanted(t, index);

	Assert(CritSectionCount > 0);
	if (logged)
	{
		amr_wal_hold_checkpoint();
		lsn = amr_wal_images(t, AMR_IMAGE_NEW, 1, &leaf_id, &img, NULL);
	}
	amr_first_leaf_commit(&amr_store, t, e, img, nulls, r, lsn);
	if (logged)
	{
		amr_wal_release_checkpoint();
		amr_store.leaves[leaf_id].full_image_lsn = lsn;
	}
	if (tier == AMR_TIER_SSD)
		amr_ssd_cache_put(t, leaf_id, amr_lt_word(&amr_store, leaf_id), img);
	amr_leaf_count_access(leaf_id, true);
}

void
amr_leaf_split_commit(Relation index, AmrTree *t, uint32 leaf_id, uint64 word,
					  const AmrPath *path, bool nulls, AmrReservation *r,
					  const AmrLeaf *left, const AmrLeaf *right,
					  const AmrFBox *left_box, const AmrFBox *right_box)
{
	AmrStore   *s = &amr_store;
	uint32		right_leaf = r->new_leaf;
	uint32		tier_left = r->tier_left;
	uint32		tier_right = r->tier_right;
	uint64		old_word = word;
	XLogRecPtr	lsn = InvalidXLogRecPtr;
	bool		logged = amr_wal_wanted(t, index);
	bool		suspect = (s->leaves[leaf_id].flags & AMR_LEAF_VOLATILE_SUSPECT) != 0;

	Assert(CritSectionCount > 0);
	if (logged)
	{
		amr_wal_hold_checkpoint();
		lsn = amr_wal_split(t, leaf_id, right_leaf, left, right);
		AMR_FAULT_POINT("split:after_logged");
	}
	amr_split_commit(s, t, leaf_id, word, path, nulls, r, left, right, left_box, right_box,
					 lsn);
	if (logged)
	{
		amr_wal_release_checkpoint();
		/* both halves travel whole in the record */
		s->leaves[leaf_id].full_image_lsn = lsn;
		s->leaves[right_leaf].full_image_lsn = lsn;
	}
	/* the core returned the old slot: not the leaf's to give if suspect */
	if (suspect)
	{
		amr_bitmap_set(AMR_WORD_TIER(old_word) == AMR_TIER_SSD ? s->ssd_used : s->pmem_used,
					   AMR_WORD_SLOT(old_word));
		s->leaves[leaf_id].flags &= ~AMR_LEAF_VOLATILE_SUSPECT;
	}
	amr_leaf_refresh_copy(leaf_id, left);
	if (tier_left == AMR_TIER_SSD)
		amr_ssd_cache_put(t, leaf_id, amr_lt_word(s, leaf_id), left);
	if (tier_right == AMR_TIER_SSD)
		amr_ssd_cache_put(t, right_leaf, amr_lt_word(s, right_leaf), right);
	amr_leaf_count_access(leaf_id, true);
}

void
amr_leaf_free(AmrTree *t, uint32 leaf_id)
{
	AmrStore   *s = &amr_store;
	uint64		word;

	amr_leaf_unhold(t, leaf_id);
	word = amr_lt_release(s, leaf_id);
	AMR_FAULT_POINT("drop:after_leaf_released");
	release_old_slot(leaf_id, word);
	amr_bitmap_clear(s->leaf_ids_used, leaf_id);
	amr_leaf_volatile_reset(&s->leaves[leaf_id]);
}

uint64
amr_leaf_current_entries(uint32 leaf_id, uint64 word)
{
	AmrStore   *s = &amr_store;

	if (AMR_WORD_TIER(word) == AMR_TIER_PMEM && AMR_WORD_SLOT(word) < s->pmem_nslots &&
		!(s->leaves[leaf_id].flags & AMR_LEAF_VOLATILE_SUSPECT))
	{
		AmrLeaf    *leaf = amr_pmem_slot(s, AMR_WORD_SLOT(word));

		if (leaf->hdr.magic == AMR_LEAF_MAGIC && leaf->hdr.nentries <= AMR_LEAF_CAPACITY)
			return amr_leaf_live_entries(leaf);
		return 0;
	}
	return s->lt[leaf_id].entries;
}

/* ---- DRAM copies held by rule R6 ---- */

bool
amr_leaf_hold(AmrTree *t, uint32 leaf_id, const AmrLeaf *image)
{
	AmrLeafVolatile *v = &amr_store.leaves[leaf_id];
	int64		c;

	if (v->dram_copy >= 0 || amr_leaf_cache_n == 0)
		return v->dram_copy >= 0;
	c = amr_bitmap_alloc(amr_leaf_cache_used);
	if (c < 0)
		return false;
	memcpy(&amr_leaf_cache[c], image, amr_leaf_image_bytes(image));
	v->dram_copy = (int32) c;
	amr_counter_add(&t->dram_leaves, 1);
	return true;
}

void
amr_leaf_unhold(AmrTree *t, uint32 leaf_id)
{
	AmrLeafVolatile *v = &amr_store.leaves[leaf_id];

	if (v->dram_copy < 0)
		return;
	amr_bitmap_clear(amr_leaf_cache_used, (uint64) v->dram_copy);
	v->dram_copy = -1;
	amr_counter_sub(&t->dram_leaves, 1);
}

void
amr_leaf_refresh_copy(uint32 leaf_id, const AmrLeaf *image)
{
	AmrLeafVolatile *v = &amr_store.leaves[leaf_id];

	/* write-through: the copy always equals the persistent image */
	if (v->dram_copy >= 0)
		memcpy(&amr_leaf_cache[v->dram_copy], image, amr_leaf_image_bytes(image));
}

/* ---- hotness ---- */

/*
 * One relaxed atomic increment; the tier manager folds the counts into the
 * decayed score at its next pass (see core/amr_policy.h, paper 3.5).
 */
void
amr_leaf_count_access(uint32 leaf_id, bool write)
{
	AmrLeafVolatile *v = &amr_store.leaves[leaf_id];

	if (write)
		amr_counter_add(&v->writes_pending, 1);
	else
		amr_counter_add(&v->reads_pending, 1);
}
