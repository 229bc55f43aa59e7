/*-------------------------------------------------------------------------
 *
 * amr_leaf.c
 *		Leaf images and the Leaf Table: appends, out-of-place publication,
 *		and the commit-point word.
 *
 * Ordering rules (each "persist" is write-back + fence):
 *
 *	append:   [widen LT box for the current version; persist]
 *			  write entry; persist; store count; persist
 *	publish:  write LT fields and box; persist; store word; persist
 *	switch:   store box for version+1; persist; store word; persist
 *
 * So after a crash a leaf's count never covers an entry that is not durable,
 * its box always covers its durable entries, and a Leaf Table word always
 * points at a complete image whose box is the one the word selects.
 *
 *-------------------------------------------------------------------------
 */
#include "amr_tree.h"
#include "amr_persist.h"

#include <string.h>

void
amr_leaf_image_init(AmrLeaf *img, uint32_t leaf_id, uint32_t tree_no,
					uint32_t generation, uint32_t version, bool nulls)
{
	memset(&img->hdr, 0, sizeof(img->hdr));
	img->hdr.magic = AMR_LEAF_MAGIC;
	img->hdr.leaf_id = leaf_id;
	img->hdr.tree_no = tree_no;
	img->hdr.tree_generation = generation;
	img->hdr.version = version;
	img->hdr.flags = nulls ? AMR_LEAF_FLAG_NULLS : 0;
	img->hdr.nentries = 0;
}

AmrFBox
amr_leaf_image_mbr(const AmrLeaf *img)
{
	AmrBox		acc = {INFINITY, INFINITY, -INFINITY, -INFINITY};
	uint64_t	i;

	/*
	 * The union in float8, rounded outward once: rounding down (up) to float4
	 * is monotonic, so it commutes with min (max), and this equals the union
	 * of the entries' rounded boxes (amr_fbox_from_box, NaN sides infinite)
	 * at a quarter of the roundings.  The comparisons are written so that a
	 * NaN coordinate widens its side to the infinity.
	 */
	for (i = 0; i < img->hdr.nentries; i++)
	{
		const AmrBox *k = &img->entries[i].key;

		if (img->entries[i].flags & (AMR_ENTRY_FLAG_NULL | AMR_ENTRY_FLAG_DEAD))
			continue;
		if (!(k->xlo >= acc.xlo))
			acc.xlo = isnan(k->xlo) ? -INFINITY : k->xlo;
		if (!(k->ylo >= acc.ylo))
			acc.ylo = isnan(k->ylo) ? -INFINITY : k->ylo;
		if (!(k->xhi <= acc.xhi))
			acc.xhi = isnan(k->xhi) ? INFINITY : k->xhi;
		if (!(k->yhi <= acc.yhi))
			acc.yhi = isnan(k->yhi) ? INFINITY : k->yhi;
	}
	return amr_fbox_from_box(&acc);
}

/* ---- CRC-32C (Castagnoli), hardware when the CPU has SSE 4.2 ---- */

static uint32_t crc_table[256];
static int	crc_impl = -1;		/* -1 unknown, 0 table, 1 sse4.2 */

static void
crc_init(void)
{
	uint32_t	i;

	for (i = 0; i < 256; i++)
	{
		uint32_t	c = i;
		int			k;

		for (k = 0; k < 8; k++)
			c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
		crc_table[i] = c;
	}
	crc_impl = __builtin_cpu_supports("sse4.2") ? 1 : 0;
}

__attribute__((target("sse4.2")))
static uint32_t
crc_update_hw(uint32_t crc, const unsigned char *p, size_t len)
{
	while (len >= 8)
	{
		uint64_t	v;

		memcpy(&v, p, 8);
		crc = (uint32_t) __builtin_ia32_crc32di(crc, v);
		p += 8;
		len -= 8;
	}
	while (len-- > 0)
		crc = __builtin_ia32_crc32qi(crc, *p++);
	return crc;
}

static uint32_t
crc_update(uint32_t crc, const void *data, size_t len)
{
	const unsigned char *p = data;

	if (crc_impl < 0)
		crc_init();
	if (crc_impl == 1)
		return crc_update_hw(crc, p, len);
	while (len-- > 0)
		crc = crc_table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
	return crc;
}

uint32_t
amr_crc32c(const void *data, size_t len)
{
	return crc_update(0xFFFFFFFFu, data, len) ^ 0xFFFFFFFFu;
}

/*
 * The checksum covers the header (with the checksum field taken as zero) and
 * the used entries; the unused tail of the slot carries no meaning.
 */
static uint32_t
leaf_image_checksum(const AmrLeaf *img)
{
	AmrLeafHeader hdr = img->hdr;
	uint64_t	n = hdr.nentries;
	uint32_t	crc;

	if (n > AMR_LEAF_CAPACITY)
		n = AMR_LEAF_CAPACITY;
	hdr.checksum = 0;
	crc = crc_update(0xFFFFFFFFu, &hdr, sizeof(hdr));
	crc = crc_update(crc, img->entries, n * sizeof(AmrLeafEntry));
	return crc ^ 0xFFFFFFFFu;
}

void
amr_leaf_image_set_checksum(AmrLeaf *img)
{
	img->hdr.flags |= AMR_LEAF_FLAG_CHECKSUM;
	img->hdr.checksum = leaf_image_checksum(img);
}

bool
amr_leaf_image_checksum_ok(const AmrLeaf *img)
{
	if (img->hdr.nentries > AMR_LEAF_CAPACITY)
		return false;
	return leaf_image_checksum(img) == img->hdr.checksum;
}

void
amr_leaf_append_pmem(AmrStore *s, uint32_t leaf_id, AmrLeaf *leaf,
					 const AmrLeafEntry *entry, const AmrFBox *ebox)
{
	uint64_t	word = amr_lt_word(s, leaf_id);
	AmrFBox    *mbr = &s->lt[leaf_id].mbr[AMR_WORD_VERSION(word) & 1];
	uint64_t	n = leaf->hdr.nentries;

	if (!(entry->flags & AMR_ENTRY_FLAG_NULL) && !amr_fbox_covers(mbr, ebox))
	{
		AmrFBox		grown = *mbr;

		amr_fbox_extend(&grown, ebox);
		*mbr = grown;
		amr_persist(mbr, sizeof(*mbr));
	}
	AMR_FAULT_POINT("append:before_entry");
	memcpy(&leaf->entries[n], entry, sizeof(*entry));
	amr_persist(&leaf->entries[n], sizeof(*entry));
	AMR_FAULT_POINT("append:after_entry_persisted");
	amr_store_persist_u64(&leaf->hdr.nentries, n + 1);
	AMR_FAULT_POINT("append:after_count_persisted");
}

uint64_t
amr_leaf_live_entries(const AmrLeaf *leaf)
{
	uint64_t	n = leaf->hdr.nentries;
	uint64_t	live = 0;
	uint64_t	i;

	if (n > AMR_LEAF_CAPACITY)
		n = AMR_LEAF_CAPACITY;
	for (i = 0; i < n; i++)
		if (!(leaf->entries[i].flags & AMR_ENTRY_FLAG_DEAD))
			live++;
	return live;
}

int
amr_leaf_find_dead(const AmrLeaf *leaf)
{
	uint64_t	i;

	for (i = 0; i < leaf->hdr.nentries && i < AMR_LEAF_CAPACITY; i++)
		if (leaf->entries[i].flags & AMR_ENTRY_FLAG_DEAD)
			return (int) i;
	return -1;
}

void
amr_leaf_mark_dead_pmem(AmrLeaf *leaf, int pos)
{
	uint16_t   *flags = &leaf->entries[pos].flags;

	__atomic_store_n(flags, (uint16_t) (*flags | AMR_ENTRY_FLAG_DEAD), __ATOMIC_RELEASE);
	amr_persist(flags, sizeof(*flags));
}

/*
 * Overwrite a dead position: the new contents are written and persisted
 * while the position still reads as dead, and clearing the flag (a 2-byte
 * store) makes the entry live, so a crash leaves either the dead position or
 * the complete new entry.
 */
void
amr_leaf_reuse_dead_pmem(AmrStore *s, uint32_t leaf_id, AmrLeaf *leaf, int pos,
						 const AmrLeafEntry *entry, const AmrFBox *ebox)
{
	uint64_t	word = amr_lt_word(s, leaf_id);
	AmrFBox    *mbr = &s->lt[leaf_id].mbr[AMR_WORD_VERSION(word) & 1];
	AmrLeafEntry *dst = &leaf->entries[pos];

	if (!(entry->flags & AMR_ENTRY_FLAG_NULL) && !amr_fbox_covers(mbr, ebox))
	{
		AmrFBox		grown = *mbr;

		amr_fbox_extend(&grown, ebox);
		*mbr = grown;
		amr_persist(mbr, sizeof(*mbr));
	}
	dst->key = entry->key;
	dst->insert_lsn = entry->insert_lsn;
	dst->tid_blk_hi = entry->tid_blk_hi;
	dst->tid_blk_lo = entry->tid_blk_lo;
	dst->tid_off = entry->tid_off;
	amr_persist(dst, sizeof(*dst));
	AMR_FAULT_POINT("append:reuse_after_entry_persisted");
	__atomic_store_n(&dst->flags, entry->flags, __ATOMIC_RELEASE);
	amr_persist(&dst->flags, sizeof(dst->flags));
	AMR_FAULT_POINT("append:reuse_after_flag_persisted");
}

/* Per-tree leaf counts by tier, kept in step with every word change. */
static void
count_tier(AmrStore *s, uint32_t tree_no, uint32_t tier, int delta)
{
	AmrTree    *t;

	if (tree_no >= AMR_MAX_TREES || s->trees == NULL)
		return;
	t = &s->trees[tree_no];
	if (tier == AMR_TIER_PMEM)
		amr_counter_add(&t->pmem_leaves, (uint64_t) (int64_t) delta);
	else if (tier == AMR_TIER_SSD)
		amr_counter_add(&t->ssd_leaves, (uint64_t) (int64_t) delta);
}

/* A WAL position as an lsn_hint: rounded up, so that (hint << shift) >= it. */
static uint32_t
lsn_to_hint(uint64_t lsn)
{
	uint64_t	hint = (lsn + ((UINT64_C(1) << AMR_LSN_HINT_SHIFT) - 1)) >> AMR_LSN_HINT_SHIFT;

	return hint >= AMR_LSN_HINT_UNKNOWN ? AMR_LSN_HINT_UNKNOWN : (uint32_t) hint;
}

uint32_t
amr_leaf_lsn_hint(const AmrLeaf *img, uint64_t stamp_lsn)
{
	uint64_t	n = img->hdr.nentries;
	uint64_t	max_lsn = stamp_lsn;
	uint64_t	i;

	if (n > AMR_LEAF_CAPACITY)
		return AMR_LSN_HINT_UNKNOWN;
	for (i = 0; i < n; i++)
		if (!(img->entries[i].flags & AMR_ENTRY_FLAG_DEAD) &&
			img->entries[i].insert_lsn > max_lsn)
			max_lsn = img->entries[i].insert_lsn;
	return lsn_to_hint(max_lsn);
}

uint32_t
amr_lsn_hint_raise(uint32_t hint, const AmrLeaf *img, uint64_t stamp_lsn)
{
	uint32_t	now = amr_leaf_lsn_hint(img, stamp_lsn);

	/*
	 * Never lower: the old hint may cover a change of this leaf whose record
	 * has not reached durable WAL yet (a split, then a move that logs
	 * nothing), and crash recovery must still find and log the leaf again. A
	 * hint left too high only makes recovery read an image it need not.
	 */
	return now > hint ? now : hint;
}

void
amr_lt_stamp(AmrStore *s, uint32_t leaf_id, uint64_t stamp_lsn)
{
	AmrLeafTableEntry *e = &s->lt[leaf_id];
	uint32_t	hint = lsn_to_hint(stamp_lsn);

	if (hint > e->lsn_hint)
	{
		e->lsn_hint = hint;
		amr_persist(&e->lsn_hint, sizeof(e->lsn_hint));
	}
}

void
amr_lt_publish_new(AmrStore *s, uint32_t leaf_id, uint32_t tree_no,
				   uint32_t generation, uint32_t flags,
				   uint32_t split_origin, uint32_t origin_version,
				   uint32_t tier, uint32_t slot, const AmrFBox *mbr,
				   const AmrLeaf *img, uint64_t stamp_lsn)
{
	AmrLeafTableEntry *e = &s->lt[leaf_id];
	uint64_t	old = amr_lt_word(s, leaf_id);
	uint32_t	version = AMR_WORD_VERSION(old) + 1;

	e->tree_no = tree_no;
	e->tree_generation = generation;
	e->flags = (uint16_t) flags;
	e->split_origin = split_origin;
	e->split_origin_version = origin_version;
	e->entries = (uint16_t) amr_leaf_live_entries(img);
	e->lsn_hint = amr_leaf_lsn_hint(img, stamp_lsn);
	e->mbr[version & 1] = *mbr;
	amr_persist(e, sizeof(*e));
	amr_store_persist_u64(&e->word, AMR_MAKE_WORD(tier, slot, version));
	count_tier(s, tree_no, tier, 1);
}

uint64_t
amr_lt_switch(AmrStore *s, uint32_t leaf_id, uint32_t tier, uint32_t slot,
			  const AmrFBox *mbr, const AmrLeaf *img, uint64_t stamp_lsn)
{
	AmrLeafTableEntry *e = &s->lt[leaf_id];
	uint64_t	old = amr_lt_word(s, leaf_id);
	uint32_t	version = AMR_WORD_VERSION(old) + 1;

	e->mbr[version & 1] = *mbr;
	e->entries = (uint16_t) amr_leaf_live_entries(img);
	e->lsn_hint = amr_lsn_hint_raise(e->lsn_hint, img, stamp_lsn);
	amr_persist(e, sizeof(*e));
	amr_store_persist_u64(&e->word, AMR_MAKE_WORD(tier, slot, version));
	count_tier(s, e->tree_no, AMR_WORD_TIER(old), -1);
	count_tier(s, e->tree_no, tier, 1);
	return old;
}

uint64_t
amr_lt_release(AmrStore *s, uint32_t leaf_id)
{
	AmrLeafTableEntry *e = &s->lt[leaf_id];
	uint64_t	old = amr_lt_word(s, leaf_id);

	amr_store_persist_u64(&e->word,
						  AMR_MAKE_WORD(AMR_TIER_NONE, 0,
										AMR_WORD_VERSION(old) + 1));
	count_tier(s, e->tree_no, AMR_WORD_TIER(old), -1);
	return old;
}

void
amr_leaf_split_images(const AmrLeaf *full, const AmrLeafEntry *extra,
					  AmrLeaf *left, AmrLeaf *right)
{
	int			n = (int) full->hdr.nentries + 1;
	AmrFBox		boxes[AMR_LEAF_CAPACITY + 1] = {{0}};
	uint8_t		goes_right[AMR_LEAF_CAPACITY + 1];
	int			i;

	if (n > (int) AMR_LEAF_CAPACITY + 1)
		n = (int) AMR_LEAF_CAPACITY + 1;

	for (i = 0; i < n; i++)
	{
		const AmrLeafEntry *e = (i < n - 1) ? &full->entries[i] : extra;

		boxes[i] = amr_fbox_from_box(&e->key);
	}
	amr_rstar_split(boxes, n, (int) (AMR_LEAF_CAPACITY * 2 / 5), goes_right);

	left->hdr.nentries = 0;
	right->hdr.nentries = 0;
	for (i = 0; i < n; i++)
	{
		const AmrLeafEntry *e = (i < n - 1) ? &full->entries[i] : extra;
		AmrLeaf    *dst = goes_right[i] ? right : left;

		if (e->flags & AMR_ENTRY_FLAG_DEAD)
			continue;
		dst->entries[dst->hdr.nentries++] = *e;
	}
}
