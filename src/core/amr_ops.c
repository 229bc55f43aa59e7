/*-------------------------------------------------------------------------
 *
 * amr_ops.c
 *		Structure-modifying operations shared by the server and the
 *		standalone tools: reserving resources, publishing a tree's first
 *		leaf, publishing a leaf split, and a single-threaded insert driver
 *		(used by the unit tests and the core micro-benchmark; the server
 *		composes the same pieces under its locks in amr_insert.c).
 *
 * Split protocol (DESIGN 3): both halves are written to fresh slots and made
 * durable; the new half is published in the Leaf Table recording "split
 * from (leaf, version)"; switching the old leaf's word to its new image is
 * the commit point.  Recovery discards a new half whose origin still has the
 * old version, so a crash anywhere leaves each entry in exactly one leaf.
 *
 *-------------------------------------------------------------------------
 */
#include "amr_tree.h"
#include "amr_persist.h"

#include <string.h>

void
amr_reservation_init(AmrReservation *r)
{
	int			i;

	r->new_leaf = AMR_INVALID_LEAF;
	r->slot_left = AMR_INVALID_SLOT;
	r->slot_right = AMR_INVALID_SLOT;
	r->nnodes = 0;
	for (i = 0; i <= AMR_MAX_HEIGHT; i++)
		r->nodes[i] = AMR_INVALID_NODE;
}

void
amr_release_reservation(AmrStore *s, AmrReservation *r)
{
	int			i;

	if (r->new_leaf != AMR_INVALID_LEAF)
		amr_bitmap_clear(s->leaf_ids_used, r->new_leaf);
	if (r->slot_left != AMR_INVALID_SLOT)
		amr_bitmap_clear(s->pmem_used, r->slot_left);
	if (r->slot_right != AMR_INVALID_SLOT)
		amr_bitmap_clear(s->pmem_used, r->slot_right);
	for (i = 0; i <= AMR_MAX_HEIGHT; i++)
		if (r->nodes[i] != AMR_INVALID_NODE)
			amr_node_free(s, r->nodes[i]);
	amr_reservation_init(r);
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

AmrStatus
amr_reserve(AmrStore *s, int need, AmrReservation *r)
{
	int64_t		v;
	int			i;

	amr_reservation_init(r);
	if (need > AMR_MAX_HEIGHT)
		return AMR_ERR_TOO_TALL;
	if ((v = amr_bitmap_alloc(s->leaf_ids_used)) < 0)
		return AMR_ERR_LEAF_IDS_FULL;
	r->new_leaf = (uint32_t) v;
	if ((v = amr_bitmap_alloc(s->pmem_used)) < 0)
		goto pmem_full;
	r->slot_left = (uint32_t) v;
	if ((v = amr_bitmap_alloc(s->pmem_used)) < 0)
		goto pmem_full;
	r->slot_right = (uint32_t) v;
	for (i = 0; i < need; i++)
	{
		if (amr_node_alloc(s, &r->nodes[i], 1) != AMR_OK)
		{
			amr_release_reservation(s, r);
			return AMR_ERR_DRAM_FULL;
		}
		r->nnodes++;
	}
	return AMR_OK;

pmem_full:
	amr_release_reservation(s, r);
	return AMR_ERR_PMEM_FULL;
}

static void
reset_volatile(AmrLeafVolatile *v)
{
	memset(v, 0, sizeof(*v));
	v->rightlink = AMR_INVALID_LEAF;
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

void
amr_publish_first_leaf(AmrStore *s, AmrTree *t, const AmrLeafEntry *e,
					   bool nulls, AmrReservation *r)
{
	uint32_t	leaf_id = r->new_leaf;
	uint32_t	version = AMR_WORD_VERSION(amr_lt_word(s, leaf_id)) + 1;
	AmrLeaf    *img = amr_pmem_slot(s, r->slot_left);
	AmrFBox		box = amr_entry_fbox(e);
	AmrFBox		mbr = nulls ? amr_fbox_empty() : box;

	amr_leaf_image_init(img, leaf_id, t->tree_no, t->generation, version, nulls);
	img->entries[0] = *e;
	img->hdr.nentries = 1;
	amr_persist(img, offsetof(AmrLeaf, entries) + sizeof(AmrLeafEntry));

	amr_lt_publish_new(s, leaf_id, t->tree_no, t->generation,
					   nulls ? AMR_LT_FLAG_NULLS : 0, AMR_INVALID_LEAF, 0,
					   AMR_TIER_PMEM, r->slot_left, &mbr);
	reset_volatile(&s->leaves[leaf_id]);
	amr_add_first_leaf(s, t, nulls, leaf_id, &box);
	__atomic_add_fetch(&t->nleaves, 1, __ATOMIC_RELAXED);

	r->new_leaf = AMR_INVALID_LEAF;
	r->slot_left = AMR_INVALID_SLOT;
}

void
amr_publish_split(AmrStore *s, AmrTree *t, uint32_t leaf_id,
				  const AmrLeaf *full, uint64_t word, const AmrPath *path,
				  const AmrLeafEntry *e, bool nulls, AmrReservation *r,
				  AmrLeaf *left, AmrLeaf *right)
{
	uint32_t	old_version = AMR_WORD_VERSION(word);
	uint32_t	right_version = AMR_WORD_VERSION(amr_lt_word(s, r->new_leaf)) + 1;
	AmrFBox		left_box,
				right_box;
	AmrFBox		zero = {0, 0, 0, 0};
	AmrLeafVolatile *lv = &s->leaves[leaf_id];
	AmrLeafVolatile *rv = &s->leaves[r->new_leaf];
	uint64_t	old_word;

	amr_leaf_image_init(left, leaf_id, t->tree_no, t->generation, old_version + 1, nulls);
	amr_leaf_image_init(right, r->new_leaf, t->tree_no, t->generation, right_version, nulls);
	amr_leaf_split_images(full, e, left, right);
	if (nulls)
		left_box = right_box = amr_fbox_empty();
	else
	{
		left_box = amr_leaf_image_mbr(left);
		right_box = amr_leaf_image_mbr(right);
	}

	/* data first: both images durable before anything points at them */
	amr_memcpy_nodrain(amr_pmem_slot(s, r->slot_right), right,
					   offsetof(AmrLeaf, entries) + right->hdr.nentries * sizeof(AmrLeafEntry));
	amr_memcpy_nodrain(amr_pmem_slot(s, r->slot_left), left,
					   offsetof(AmrLeaf, entries) + left->hdr.nentries * sizeof(AmrLeafEntry));
	amr_drain();

	amr_lt_publish_new(s, r->new_leaf, t->tree_no, t->generation,
					   nulls ? AMR_LT_FLAG_NULLS : 0,
					   leaf_id, old_version, AMR_TIER_PMEM, r->slot_right, &right_box);
	/* commit point */
	old_word = amr_lt_switch(s, leaf_id, AMR_TIER_PMEM, r->slot_left, &left_box);
	amr_free_word_slot(s, old_word);

	/*
	 * GiST-style links, so that scans which collected their leaves before
	 * the split find the moved entries: the right half inherits the old NSN
	 * and right link, the left half gets a new NSN and points right.
	 */
	reset_volatile(rv);
	rv->nsn = lv->nsn;
	rv->rightlink = lv->rightlink;
	rv->hotness = lv->hotness;
	rv->last_access = lv->last_access;
	lv->nsn = __atomic_add_fetch(&t->nsn, 1, __ATOMIC_SEQ_CST);
	lv->rightlink = r->new_leaf;
	lv->smo_count++;
	rv->smo_count = lv->smo_count;

	amr_apply_leaf_split(s, t, nulls, path, nulls ? &zero : &left_box,
						 r->new_leaf, nulls ? &zero : &right_box, r->nodes);
	__atomic_add_fetch(&t->nleaves, 1, __ATOMIC_RELAXED);

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

		if (!nulls)
			amr_path_enlarge(s, &path, &box);
		if (leaf->hdr.nentries < AMR_LEAF_CAPACITY)
		{
			amr_leaf_append_pmem(s, leaf_id, leaf, e, &box);
			__atomic_add_fetch(&t->nentries, 1, __ATOMIC_RELAXED);
			return AMR_OK;
		}
		if (amr_leaf_find_dead(leaf) >= 0)
		{
			amr_leaf_reuse_dead_pmem(s, leaf_id, leaf, amr_leaf_find_dead(leaf), e, &box);
			__atomic_add_fetch(&t->nentries, 1, __ATOMIC_RELAXED);
			return AMR_OK;
		}
		if ((st = amr_reserve(s, amr_path_nodes_needed(s, &path), &r)) != AMR_OK)
			return st;
		amr_publish_split(s, t, leaf_id, leaf, word, &path, e, nulls, &r,
						  &left, &right);
	}
	else
	{
		if ((st = amr_reserve(s, 0, &r)) != AMR_OK)
			return st;
		amr_publish_first_leaf(s, t, e, nulls, &r);
	}
	amr_release_reservation(s, &r);
	__atomic_add_fetch(&t->nentries, 1, __ATOMIC_RELAXED);
	return AMR_OK;
}
