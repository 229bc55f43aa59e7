/*-------------------------------------------------------------------------
 *
 * amr_ops.c
 *		Structure-modifying operations shared by the server and the
 *		standalone tools: reserving resources, publishing a tree's first
 *		leaf, publishing a leaf split, and a single-threaded insert driver
 *		(used by the unit tests and the core micro-benchmark; the server
 *		composes the same pieces under its locks in amr_insert.c).
 *
 * Each publication comes in two halves so that the caller can write the
 * prepared images to whichever tier their slots are on (a PMEM copy, or an
 * O_DIRECT write and sync to SSD) in between:
 *
 *	prepare:  build the images and their boxes in caller memory
 *	(caller): make both images durable in their reserved slots
 *	commit:   publish / switch Leaf Table words, links, inner nodes
 *
 * Split protocol (docs/design.md, "Commit points"): the new half is published in the Leaf Table
 * recording "split from (leaf, version)"; switching the old leaf's word to
 * its new image is the commit point.  Recovery discards a new half whose
 * origin still has the old version, so a crash anywhere leaves each entry in
 * exactly one leaf.
 *
 *-------------------------------------------------------------------------
 */
#include "amr_tree.h"
#include "amr_persist.h"

#include <string.h>

static AmrBitmap *
tier_bitmap(AmrStore *s, uint32_t tier)
{
	return tier == AMR_TIER_SSD ? s->ssd_used : s->pmem_used;
}

void
amr_reservation_init(AmrReservation *r)
{
	int			i;

	r->new_leaf = AMR_INVALID_LEAF;
	r->slot_left = AMR_INVALID_SLOT;
	r->slot_right = AMR_INVALID_SLOT;
	r->tier_left = AMR_TIER_PMEM;
	r->tier_right = AMR_TIER_PMEM;
	r->nnodes = 0;
	for (i = 0; i <= AMR_MAX_HEIGHT; i++)
		r->nodes[i] = AMR_INVALID_NODE;
	r->splits.n = 0;
}

void
amr_release_reservation(AmrStore *s, AmrReservation *r)
{
	int			i;

	if (r->new_leaf != AMR_INVALID_LEAF)
		amr_bitmap_clear(s->leaf_ids_used, r->new_leaf);
	amr_slot_give_back(s, r->tier_left, r->slot_left);
	amr_slot_give_back(s, r->tier_right, r->slot_right);
	for (i = 0; i <= AMR_MAX_HEIGHT; i++)
		if (r->nodes[i] != AMR_INVALID_NODE)
			amr_node_free(s, r->nodes[i]);
	amr_reservation_init(r);
}

/* A free slot of one tier, within the reserve or not. */
static int64_t
take_on_tier(AmrStore *s, uint32_t tier, bool may_use_reserve)
{
	AmrBitmap  *bm = tier_bitmap(s, tier);

	if (bm == NULL)
		return -1;
	return may_use_reserve ? amr_bitmap_alloc(bm) : amr_bitmap_alloc_keep(bm, AMR_SLOT_RESERVE);
}

AmrStatus
amr_slot_take(AmrStore *s, AmrSlotPurpose purpose, uint32_t tier,
			  uint32_t *tier_out, uint32_t *slot_out)
{
	bool		reserve_ok = purpose == AMR_SLOT_REPLACES || purpose == AMR_SLOT_REPLACES_HERE;
	bool		other_ok = purpose == AMR_SLOT_ADDS || purpose == AMR_SLOT_REPLACES;
	uint32_t	other = tier == AMR_TIER_SSD ? AMR_TIER_PMEM : AMR_TIER_SSD;
	int64_t		v;

	if ((v = take_on_tier(s, tier, reserve_ok)) >= 0)
	{
		*tier_out = tier;
		*slot_out = (uint32_t) v;
		return AMR_OK;
	}
	if (other_ok && (v = take_on_tier(s, other, reserve_ok)) >= 0)
	{
		*tier_out = other;
		*slot_out = (uint32_t) v;
		return AMR_OK;
	}
	/* both tiers full is an SSD-tier matter when there is one */
	if (tier == AMR_TIER_SSD || (other_ok && s->ssd_used != NULL))
		return AMR_ERR_SSD_FULL;
	return AMR_ERR_PMEM_FULL;
}

void
amr_slot_give_back(AmrStore *s, uint32_t tier, uint32_t slot)
{
	AmrBitmap  *bm = tier_bitmap(s, tier);

	if (bm != NULL && slot != AMR_INVALID_SLOT)
		amr_bitmap_clear(bm, slot);
}

AmrStatus
amr_reserve(AmrStore *s, int need, uint32_t tier_left, uint32_t tier_right,
			bool left_adds, AmrReservation *r)
{
	int64_t		v;
	int			i;
	AmrStatus	st;

	amr_reservation_init(r);
	r->tier_left = tier_left;
	r->tier_right = tier_right;
	if (need > AMR_MAX_HEIGHT)
		return AMR_ERR_TOO_TALL;
	if ((v = amr_bitmap_alloc(s->leaf_ids_used)) < 0)
		return AMR_ERR_LEAF_IDS_FULL;
	r->new_leaf = (uint32_t) v;
	if ((st = amr_slot_take(s, left_adds ? AMR_SLOT_ADDS : AMR_SLOT_REPLACES, tier_left,
							&r->tier_left, &r->slot_left)) != AMR_OK)
		goto fail;
	if (tier_right != AMR_TIER_NONE &&
		(st = amr_slot_take(s, AMR_SLOT_ADDS, tier_right, &r->tier_right,
							&r->slot_right)) != AMR_OK)
		goto fail;
	for (i = 0; i < need; i++)
	{
		if (amr_node_alloc(s, &r->nodes[i], 1) != AMR_OK)
		{
			st = AMR_ERR_DRAM_FULL;
			goto fail;
		}
		r->nnodes++;
	}
	return AMR_OK;

fail:
	amr_release_reservation(s, r);
	return st;
}

int
amr_path_nodes_needed(const AmrStore *s, const AmrPath *path)
{
	int			need = 0;
	int			d;

	/* a full level-1 node splits, then its parent if full, and so on */
	for (d = path->depth - 1; d >= 0; d--)
	{
		if (s->nodes[path->node[d]].count < AMR_INNER_FANOUT)
			return need;
		need++;
	}
	return need + 1;			/* the root split: a new root */
}

void
amr_free_word_slot(AmrStore *s, uint64_t word)
{
	switch (AMR_WORD_TIER(word))
	{
		case AMR_TIER_PMEM:
			amr_bitmap_clear(s->pmem_used, AMR_WORD_SLOT(word));
			break;
		case AMR_TIER_SSD:
			if (s->ssd_used)
				amr_bitmap_clear(s->ssd_used, AMR_WORD_SLOT(word));
			break;
		default:
			break;
	}
}

AmrFBox
amr_entry_fbox(const AmrLeafEntry *e)
{
	if (e->flags & AMR_ENTRY_FLAG_NULL)
	{
		AmrFBox		zero = {0, 0, 0, 0};

		return zero;
	}
	return amr_fbox_from_box(&e->key);
}

size_t
amr_leaf_image_bytes(const AmrLeaf *img)
{
	return offsetof(AmrLeaf, entries) + img->hdr.nentries * sizeof(AmrLeafEntry);
}

void
amr_pmem_write_image(AmrStore *s, uint32_t slot, const AmrLeaf *img)
{
	amr_memcpy_persist(amr_pmem_slot(s, slot), img, amr_leaf_image_bytes(img));
}

void
amr_leaf_volatile_reset(AmrLeafVolatile *v)
{
	memset(v, 0, sizeof(*v));
	v->rightlink = AMR_INVALID_LEAF;
	v->dram_copy = -1;
}

void
amr_first_leaf_prepare(AmrStore *s, AmrTree *t, const AmrLeafEntry *e,
					   bool nulls, const AmrReservation *r, AmrLeaf *img)
{
	uint32_t	version = AMR_WORD_VERSION(amr_lt_word(s, r->new_leaf)) + 1;

	amr_leaf_image_init(img, r->new_leaf, t->tree_no, t->generation, version, nulls);
	img->entries[0] = *e;
	img->hdr.nentries = 1;
}

void
amr_first_leaf_commit(AmrStore *s, AmrTree *t, const AmrLeafEntry *e,
					  const AmrLeaf *img, bool nulls, AmrReservation *r, uint64_t stamp_lsn)
{
	uint32_t	leaf_id = r->new_leaf;
	AmrFBox		box = amr_entry_fbox(e);
	AmrFBox		mbr = nulls ? amr_fbox_empty() : box;

	amr_lt_publish_new(s, leaf_id, t->tree_no, t->generation,
					   nulls ? AMR_LT_FLAG_NULLS : 0, AMR_INVALID_LEAF, 0,
					   r->tier_left, r->slot_left, &mbr, img, stamp_lsn);
	AMR_FAULT_POINT("first_leaf:after_publish");
	amr_leaf_volatile_reset(&s->leaves[leaf_id]);
	s->leaves[leaf_id].writes_pending = 1;
	amr_add_first_leaf(s, t, nulls, leaf_id, &box);
	amr_counter_add(&t->nleaves, 1);

	r->new_leaf = AMR_INVALID_LEAF;
	r->slot_left = AMR_INVALID_SLOT;
}

void
amr_split_prepare(AmrStore *s, AmrTree *t, uint32_t leaf_id,
				  const AmrLeaf *full, uint64_t word, const AmrLeafEntry *e,
				  bool nulls, const AmrReservation *r,
				  AmrLeaf *left, AmrLeaf *right,
				  AmrFBox *left_box, AmrFBox *right_box)
{
	uint32_t	old_version = AMR_WORD_VERSION(word);
	uint32_t	right_version = AMR_WORD_VERSION(amr_lt_word(s, r->new_leaf)) + 1;

	amr_leaf_image_init(left, leaf_id, t->tree_no, t->generation, old_version + 1, nulls);
	amr_leaf_image_init(right, r->new_leaf, t->tree_no, t->generation, right_version, nulls);
	amr_leaf_split_images(full, e, left, right);
	if (nulls)
		*left_box = *right_box = amr_fbox_empty();
	else
	{
		*left_box = amr_leaf_image_mbr(left);
		*right_box = amr_leaf_image_mbr(right);
	}
}

void
amr_split_commit(AmrStore *s, AmrTree *t, uint32_t leaf_id, uint64_t word,
				 const AmrPath *path, bool nulls, AmrReservation *r,
				 const AmrLeaf *left, const AmrLeaf *right,
				 const AmrFBox *left_box, const AmrFBox *right_box, uint64_t stamp_lsn)
{
	AmrFBox		zero = {0, 0, 0, 0};
	AmrLeafVolatile *lv = &s->leaves[leaf_id];
	AmrLeafVolatile *rv = &s->leaves[r->new_leaf];
	uint64_t	old_word;

	amr_lt_publish_new(s, r->new_leaf, t->tree_no, t->generation,
					   nulls ? AMR_LT_FLAG_NULLS : 0,
					   leaf_id, AMR_WORD_VERSION(word), r->tier_right, r->slot_right,
					   right_box, right, stamp_lsn);
	AMR_FAULT_POINT("split:after_publish");
	/* commit point */
	old_word = amr_lt_switch(s, leaf_id, r->tier_left, r->slot_left, left_box, left,
							 stamp_lsn);
	AMR_FAULT_POINT("split:after_switch");
	amr_free_word_slot(s, old_word);

	/*
	 * GiST-style links, so that scans which collected their leaves before the
	 * split find the moved entries: the right half inherits the old NSN and
	 * right link, the left half gets a new NSN and points right.  The halves
	 * share the leaf's access history, but each counts only this split:
	 * inheriting the split score would make whole lineages look like frequent
	 * splitters (rule R6).
	 */
	amr_leaf_volatile_reset(rv);
	rv->nsn = lv->nsn;
	rv->rightlink = lv->rightlink;
	rv->hotness = lv->hotness;
	rv->update_hot = lv->update_hot;
	rv->last_fold = lv->last_fold;
	rv->splits_pending = 1;
	rv->writes_pending = 1;
	lv->nsn = amr_sync_add(&t->nsn, 1);
	lv->rightlink = r->new_leaf;
	amr_counter_add(&lv->splits_pending, 1);

	amr_apply_leaf_split(s, t, nulls, path, nulls ? &zero : left_box,
						 r->new_leaf, nulls ? &zero : right_box, r->nodes, &r->splits);
	amr_counter_add(&t->nleaves, 1);

	r->new_leaf = AMR_INVALID_LEAF;
	r->slot_left = r->slot_right = AMR_INVALID_SLOT;
}

AmrStatus
amr_insert_single(AmrStore *s, AmrTree *t, const AmrLeafEntry *e)
{
	bool		nulls = (e->flags & AMR_ENTRY_FLAG_NULL) != 0;
	AmrFBox		box = amr_entry_fbox(e);
	AmrPath		path;
	uint32_t	leaf_id;
	AmrReservation r;
	AmrStatus	st;
	static __thread AmrLeaf left,
				right;

	leaf_id = amr_choose_leaf(s, t, nulls, &box, &path);
	if (leaf_id != AMR_INVALID_LEAF)
	{
		uint64_t	word = amr_lt_word(s, leaf_id);
		AmrLeaf    *leaf = amr_pmem_slot(s, AMR_WORD_SLOT(word));
		AmrFBox		lbox,
					rbox;
		int			dead;

		if (!nulls)
			amr_path_enlarge(s, &path, &box);
		if (leaf->hdr.nentries < AMR_LEAF_CAPACITY)
		{
			amr_leaf_append_pmem(s, leaf_id, leaf, e, &box);
			amr_counter_add(&t->nentries, 1);
			return AMR_OK;
		}
		if ((dead = amr_leaf_find_dead(leaf)) >= 0)
		{
			amr_leaf_reuse_dead_pmem(s, leaf_id, leaf, dead, e, &box);
			amr_counter_add(&t->nentries, 1);
			return AMR_OK;
		}
		st = amr_reserve(s, amr_path_nodes_needed(s, &path), AMR_TIER_PMEM,
						 AMR_TIER_PMEM, false, &r);
		if (st != AMR_OK)
			return st;
		amr_split_prepare(s, t, leaf_id, leaf, word, e, nulls, &r, &left, &right,
						  &lbox, &rbox);
		amr_memcpy_nodrain(amr_pmem_slot(s, r.slot_right), &right, amr_leaf_image_bytes(&right));
		amr_memcpy_nodrain(amr_pmem_slot(s, r.slot_left), &left, amr_leaf_image_bytes(&left));
		amr_drain();
		amr_split_commit(s, t, leaf_id, word, &path, nulls, &r, &left, &right,
						 &lbox, &rbox, 0);
	}
	else
	{
		if ((st = amr_reserve(s, 0, AMR_TIER_PMEM, AMR_TIER_NONE, true, &r)) != AMR_OK)
			return st;
		amr_first_leaf_prepare(s, t, e, nulls, &r, &left);
		amr_pmem_write_image(s, r.slot_left, &left);
		amr_first_leaf_commit(s, t, e, &left, nulls, &r, 0);
	}
	amr_release_reservation(s, &r);
	amr_counter_add(&t->nentries, 1);
	return AMR_OK;
}
