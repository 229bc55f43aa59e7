/*-------------------------------------------------------------------------
 *
 * amr_tree.h
 *		The AMR-Tree core: inner nodes in DRAM, the Leaf Table, leaf images,
 *		splits, bulk packing and structural checks.
 *
 * No PostgreSQL headers: the core works on plain memory (shared memory and a
 * mapped pool when run in the server; malloc and a mapped file when run by
 * the micro-benchmark and unit tests).  Locking is the caller's business;
 * each function states what it expects to be held.  Functions that can fail
 * return an AmrStatus and leave persistent state untouched on failure.
 *
 *-------------------------------------------------------------------------
 */
#ifndef AMR_TREE_H
#define AMR_TREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "amr_atomic.h"
#include "amr_bitmap.h"
#include "amr_format.h"
#include "amr_geom.h"

/* Inner node fan-out.  SoA layout: four float4 arrays compared lane-wise. */
#define AMR_INNER_FANOUT		64
#define AMR_MAX_HEIGHT			16
#define AMR_INVALID_NODE		UINT32_MAX

typedef enum AmrStatus
{
	AMR_OK = 0,
	AMR_ERR_DRAM_FULL,			/* inner node arena exhausted */
	AMR_ERR_PMEM_FULL,			/* no free PMEM slot */
	AMR_ERR_SSD_FULL,			/* no free SSD slot */
	AMR_ERR_LEAF_IDS_FULL,		/* Leaf Table has no free entry */
	AMR_ERR_TOO_TALL			/* tree would exceed AMR_MAX_HEIGHT */
} AmrStatus;

typedef struct AmrInnerNode
{
	uint16_t	count;
	uint16_t	level;			/* 1: children are leaf ids */
	uint32_t	reserved;
	float		xlo[AMR_INNER_FANOUT];
	float		ylo[AMR_INNER_FANOUT];
	float		xhi[AMR_INNER_FANOUT];
	float		yhi[AMR_INNER_FANOUT];
	uint32_t	child[AMR_INNER_FANOUT];	/* node index, or leaf id at level
											 * 1 */
} AmrInnerNode;

/*
 * Volatile per-leaf state, indexed by leaf id.  Rebuilt (zeroed) after every
 * restart; never persisted (persisting hotness would put a PMEM write on
 * every read).
 */
typedef struct AmrLeafVolatile
{
	uint64_t	nsn;			/* tree split counter when this leaf last
								 * split */
	uint32_t	rightlink;		/* leaf created by that split */
	uint32_t	pins;			/* scans that may still return its entries */
	uint32_t	replay_origin;	/* replay only: leaf id + 1 of the leaf a
								 * split took entries from while scans pinned
								 * it, 0 if none (amr_pins.c) */
	/* accesses since the tier manager last folded them in (atomic adds) */
	uint32_t	reads_pending;
	uint32_t	writes_pending;
	uint32_t	splits_pending;
	int32_t		dram_copy;		/* R6 hold: slot of its DRAM copy, or -1 */
	uint32_t	ssd_cache_hint; /* SSD cache slot + 1 that last held a copy, 0
								 * if none (amr_ssdcache.c) */
	/* decayed scores, maintained by the tier manager (paper 3.5) */
	float		hotness;		/* all accesses */
	float		update_hot;		/* writes: appends, rewrites (R3) */
	float		smo_hot;		/* splits (R6) */
	uint32_t	flags;			/* AMR_LEAF_VOLATILE_* */
	double		last_fold;		/* when the scores were last decayed */
	uint64_t	full_image_lsn; /* end of the last WAL record that carried
								 * this leaf whole, 0 if none since the server
								 * started (amr_wal.c) */
} AmrLeafVolatile;

/*
 * A leaf whose Leaf Table word, in a pool that WAL replay is about to bring
 * up to date, names a slot it cannot own (out of range, or another leaf's):
 * a copy of the pool torn by a base backup.  Replay must install a whole
 * image of it before the standby is consistent; its old slot is never
 * freed (it belongs to the other leaf).  See amr_walredo.c.
 */
#define AMR_LEAF_VOLATILE_SUSPECT	0x0001

/*
 * WAL replay over a copy met a delta (APPEND) that does not fit the leaf:
 * the copy holds a later state of it.  The primary logged that delta as
 * the leaf's first record after a checkpoint's redo pointer on a stale
 * look at the pointer, and then the leaf whole in its next record
 * (amr_wal_delta_came_first); replay must install that image before
 * anything else changes the leaf.  See amr_walredo.c.
 */
#define AMR_LEAF_VOLATILE_AWAITS_IMAGE	0x0002

/* DRAM descriptor of one tree (index), indexed by tree number. */
typedef struct AmrTree
{
	uint32_t	tree_no;
	uint32_t	generation;
	uint32_t	root;			/* AMR_INVALID_NODE until built */
	uint32_t	height;			/* inner levels; root is at this level */
	uint32_t	null_root;		/* a second tree holding the NULL keys */
	uint32_t	null_height;
	uint64_t	nentries;		/* atomic */
	uint64_t	nleaves;		/* atomic */
	uint64_t	ninner;			/* atomic */
	uint64_t	inner_epoch;	/* atomic: bumped when the inner nodes are
								 * freed (a repack), which ninner alone may
								 * not show */
	uint64_t	nsn;			/* atomic split counter (GiST's NSN idea) */
	uint64_t	pinned;			/* atomic: leaf pins held by scans */
	uint64_t	removals_begun; /* atomic: passes that remove entries (VACUUM,
								 * their replay) begun ... */
	uint64_t	removals_finished;	/* ... and the number of the last one
									 * finished (amr_pins.c) */
	uint64_t	resync_seq;		/* atomic: odd while WAL replay applies a
								 * resync record, bumped again after it
								 * (amr_walredo.c, amr_scan.c) */
	/* leaves per tier, maintained by the Leaf Table functions (atomic) */
	uint64_t	pmem_leaves;
	uint64_t	ssd_leaves;
	uint64_t	dram_leaves;	/* leaves with a DRAM copy (R6) */
	/* placement settings (from the tree record) */
	uint32_t	budget_kind;
	bool		tiering;
	double		budget_value;
	/* tier manager */
	uint32_t	tier_busy;		/* atomic: a cycle is running */
	uint64_t	promotions;
	uint64_t	demotions;
	uint64_t	budget_demotions;
	uint64_t	rule_demotions;
	uint64_t	write_promotions;	/* SSD leaves rewritten to PMEM by writes */
	uint64_t	bytes_moved;
	uint64_t	tier_passes;	/* tier-manager passes over this tree */
	double		last_tier_pass; /* seconds since the Unix epoch, 0 = never */
	/* lifecycle */
	uint32_t	drops_pending;	/* atomic: transactions that will drop this
								 * tree if they commit */
	uint32_t	inner_stale;	/* WAL replay published leaves without inner
								 * nodes (a build): build them before use */
} AmrTree;

/*
 * Everything the core touches.  The pool parts point into the mapped PMEM
 * pool; the rest into DRAM (shared memory in the server).
 */
typedef struct AmrStore
{
	char	   *pool_base;
	AmrPoolHeader *header;
	char	   *pmem_slots;		/* AMR_SLOT_SIZE-aligned */
	uint32_t	pmem_nslots;
	AmrLeafTableEntry *lt;
	uint32_t	lt_capacity;
	AmrTreeRecord *tree_records;

	AmrBitmap  *pmem_used;		/* bit set = slot referenced or reserved */
	AmrBitmap  *ssd_used;		/* NULL when there is no SSD tier */
	uint32_t	ssd_nslots;
	AmrBitmap  *leaf_ids_used;
	AmrBitmap  *nodes_used;
	AmrInnerNode *nodes;
	uint32_t	nnodes;
	AmrLeafVolatile *leaves;	/* lt_capacity entries */
	AmrTree    *trees;			/* AMR_MAX_TREES entries */
} AmrStore;

/* Root-to-level-1 path chosen for an insertion. */
typedef struct AmrPath
{
	int			depth;
	uint32_t	node[AMR_MAX_HEIGHT];
	uint16_t	idx[AMR_MAX_HEIGHT];
} AmrPath;

/* A key of a scan in the core's terms. */
typedef struct AmrScanKey
{
	int			strategy;
	bool		prune;			/* false: query has NaN, never prune inner
								 * nodes, test leaves with PostgreSQL's own
								 * operator */
	AmrBox		query;
} AmrScanKey;

/* An item to pack: a bounding box and what it points to. */
typedef struct AmrPackItem
{
	AmrFBox		box;
	uint32_t	ref;
} AmrPackItem;

/*
 * An item to pack by its centre only, for the leaf level of a build: the
 * boxes are the entries' own, and 12 bytes an item instead of 20 take
 * less memory (every page of it fresh, so a page fault each) and move
 * fewer bytes per radix pass.  Keys: amr_pack_point.
 */
typedef struct AmrPackPoint
{
	uint32_t	xkey;			/* the centre's x, as an order-preserving key */
	uint32_t	ykey;
	uint32_t	ref;
} AmrPackPoint;

/* Growable array of leaf ids (scan candidates). */
typedef struct AmrLeafList
{
	uint32_t   *ids;
	uint32_t	n;
	uint32_t	cap;
} AmrLeafList;

typedef void *(*AmrReallocFn) (void *ptr, size_t size, void *arg);

/* Set an entry's key, flagging a key with NaN coordinates. */
static inline void
amr_entry_set_key(AmrLeafEntry *e, const AmrBox *key)
{
	e->key = *key;
	if (amr_box_has_nan(key))
		e->flags |= AMR_ENTRY_FLAG_NAN;
	else
		e->flags &= ~AMR_ENTRY_FLAG_NAN;
}

/* ---- Leaf Table and leaf images (amr_leaf.c) ---- */

static inline AmrLeaf *
amr_pmem_slot(const AmrStore *s, uint32_t slot)
{
	return (AmrLeaf *) (s->pmem_slots + (size_t) slot * AMR_SLOT_SIZE);
}

static inline uint64_t
amr_lt_word(const AmrStore *s, uint32_t leaf_id)
{
	return __atomic_load_n(&s->lt[leaf_id].word, __ATOMIC_ACQUIRE);
}

/* Does the Leaf Table entry with this word belong to tree (tree_no, generation)? */
static inline bool
amr_lt_owned_by(const AmrStore *s, uint32_t leaf_id, uint64_t word,
				uint32_t tree_no, uint32_t generation)
{
	const AmrLeafTableEntry *e = &s->lt[leaf_id];

	return AMR_WORD_TIER(word) != AMR_TIER_NONE && e->tree_no == tree_no &&
		e->tree_generation == generation;
}

/*
 * The next leaf of tree (tree_no, generation) at or after *id: sets *id and
 * *word and returns true, or returns false at the end of the Leaf Table.
 * Iterate with: for (id = 0; amr_lt_next_of_tree(s, no, gen, &id, &word); id++)
 */
static inline bool
amr_lt_next_of_tree(const AmrStore *s, uint32_t tree_no, uint32_t generation,
					uint32_t *id, uint64_t *word)
{
	for (; *id < s->lt_capacity; (*id)++)
	{
		*word = amr_lt_word(s, *id);
		if (amr_lt_owned_by(s, *id, *word, tree_no, generation))
			return true;
	}
	return false;
}

static inline AmrFBox
amr_lt_mbr(const AmrStore *s, uint32_t leaf_id, uint64_t word)
{
	return s->lt[leaf_id].mbr[AMR_WORD_VERSION(word) & 1];
}

/* An empty leaf image for (leaf id, tree, generation, version), NULL side or not. */
extern void amr_leaf_image_init(AmrLeaf *img, uint32_t leaf_id, uint32_t tree_no,
								uint32_t generation, uint32_t version,
								bool nulls);

/* The float4 bounding box of an image's live entries. */
extern AmrFBox amr_leaf_image_mbr(const AmrLeaf *img);

/* CRC-32C of data (SSD images' checksums). */
extern uint32_t amr_crc32c(const void *data, size_t len);

/* Seal an image with its checksum (SSD). */
extern void amr_leaf_image_set_checksum(AmrLeaf *img);

/* Whether a sealed image's checksum holds. */
extern bool amr_leaf_image_checksum_ok(const AmrLeaf *img);

/*
 * Append one entry to a PMEM-resident leaf in place: widen the Leaf Table
 * MBR if needed (persisted), persist the entry, then store and persist the
 * count.  Caller holds the leaf exclusively; the leaf has room.
 */
extern void amr_leaf_append_pmem(AmrStore *s, uint32_t leaf_id, AmrLeaf *leaf,
								 const AmrLeafEntry *entry, const AmrFBox *ebox);

/* Entries not marked dead. */
extern uint64_t amr_leaf_live_entries(const AmrLeaf *leaf);

/* Position of a dead entry that an insert may reuse, or -1. */
extern int	amr_leaf_find_dead(const AmrLeaf *leaf);

/* Mark an entry dead in place (one persisted 2-byte store). */
extern void amr_leaf_mark_dead_pmem(AmrLeaf *leaf, int pos);

/* Put an entry into a dead position, failure-atomically. */
extern void amr_leaf_reuse_dead_pmem(AmrStore *s, uint32_t leaf_id, AmrLeaf *leaf,
									 int pos, const AmrLeafEntry *entry,
									 const AmrFBox *ebox);

/*
 * Publish a leaf id that was free: write its Leaf Table fields, persist,
 * then store and persist the word.  "img" is the image the word will point
 * at (its live entries and WAL positions are summarised in the entry).
 */
extern void amr_lt_publish_new(AmrStore *s, uint32_t leaf_id, uint32_t tree_no,
							   uint32_t generation, uint32_t flags,
							   uint32_t split_origin, uint32_t origin_version,
							   uint32_t tier, uint32_t slot, const AmrFBox *mbr,
							   const AmrLeaf *img, uint64_t stamp_lsn);

/*
 * Switch an existing leaf to a new image: store the MBR for the next
 * version (and the image's summary), persist, then store and persist the
 * new word.  Returns the old word so the caller can reclaim the old slot.
 * These functions also keep the tree's per-tier leaf counts.
 *
 * stamp_lsn (0 if none) is the end of the WAL record that logged the
 * change: the Leaf Table's lsn_hint is raised to cover it, so that after a
 * crash a change whose record did not reach durable WAL can be found.  A
 * switch never lowers the hint (amr_lsn_hint_raise): an unlogged move
 * right after a split whose record is not yet durable must leave the split
 * found.
 */
extern uint64_t amr_lt_switch(AmrStore *s, uint32_t leaf_id, uint32_t tier,
							  uint32_t slot, const AmrFBox *mbr,
							  const AmrLeaf *img, uint64_t stamp_lsn);

/*
 * Upper bound of an image's entry WAL positions and of stamp_lsn, as a Leaf
 * Table lsn_hint.
 */
extern uint32_t amr_leaf_lsn_hint(const AmrLeaf *img, uint64_t stamp_lsn);

/*
 * The lsn_hint a leaf switching to img gets: its hint so far, raised to
 * amr_leaf_lsn_hint(img, stamp_lsn).
 */
extern uint32_t amr_lsn_hint_raise(uint32_t hint, const AmrLeaf *img, uint64_t stamp_lsn);

/*
 * Raise a leaf's lsn_hint to cover stamp_lsn, the end of the record of a
 * change made in place (entries marked dead), and persist it; must be
 * durable before the change is.
 */
extern void amr_lt_stamp(AmrStore *s, uint32_t leaf_id, uint64_t stamp_lsn);

/* Mark a leaf id free (version still grows); returns the old word. */
extern uint64_t amr_lt_release(AmrStore *s, uint32_t leaf_id);

/*
 * Split: distribute the entries of a full leaf plus one new entry between
 * two images with the R*-tree split heuristic.  "left" keeps the leaf id;
 * "right" is the new leaf.
 */
extern void amr_leaf_split_images(const AmrLeaf *full, const AmrLeafEntry *extra,
								  AmrLeaf *left, AmrLeaf *right);

/* ---- Inner nodes (amr_inner.c) ---- */

/* Take an empty inner node of the given level from the arena. */
extern AmrStatus amr_node_alloc(AmrStore *s, uint32_t *node_out, int level);

/* Return an inner node to the arena. */
extern void amr_node_free(AmrStore *s, uint32_t node);

static inline AmrFBox
amr_node_entry_box(const AmrInnerNode *n, int i)
{
	AmrFBox		b = {n->xlo[i], n->ylo[i], n->xhi[i], n->yhi[i]};

	return b;
}

static inline void
amr_node_set_entry(AmrInnerNode *n, int i, const AmrFBox *b, uint32_t child)
{
	n->xlo[i] = b->xlo;
	n->ylo[i] = b->ylo;
	n->xhi[i] = b->xhi;
	n->yhi[i] = b->yhi;
	n->child[i] = child;
}

/* The union of an inner node's entry boxes. */
extern AmrFBox amr_node_union(const AmrInnerNode *n);

/*
 * Reset the DRAM descriptor of tree tree_no to nothing (no nodes, no
 * counters), with the generation and placement settings of its record.
 */
extern void amr_tree_descriptor_init(AmrTree *t, uint32_t tree_no, const AmrTreeRecord *rec);

/* Create an empty tree (one empty level-1 root) and an empty NULL tree. */
extern AmrStatus amr_tree_init_empty(AmrStore *s, AmrTree *t);

/* Free every inner node of a tree (both the box tree and the NULL tree). */
extern void amr_tree_free_nodes(AmrStore *s, AmrTree *t);

/*
 * Descend to the level-1 entry whose box needs the least enlargement (ties:
 * smallest area).  Returns the leaf id or AMR_INVALID_LEAF if the tree has
 * no leaf.  Caller holds the tree lock (shared is enough).
 */
extern uint32_t amr_choose_leaf(const AmrStore *s, const AmrTree *t, bool nulls,
								const AmrFBox *b, AmrPath *path);

/*
 * Find the path from the root to the level-1 entry of leaf_id, whose box
 * covers "box" (the leaf's Leaf Table box: every box on its path covers it),
 * by searching every subtree whose box covers it, as GiST's gistFindPath
 * does.  For WAL replay, which knows a leaf but not where the replaying
 * server's inner nodes keep it.  Returns false if the leaf is not found.
 * Caller holds the tree lock.
 */
extern bool amr_find_leaf_path(const AmrStore *s, const AmrTree *t, bool nulls,
							   uint32_t leaf_id, const AmrFBox *box, AmrPath *path);

/* Widen every box on the path to cover b (atomic, monotone). */
extern void amr_path_enlarge(AmrStore *s, const AmrPath *path, const AmrFBox *b);

/*
 * The path's nodes whose entry box does not cover b yet, i.e. that
 * amr_path_enlarge would change; stored in nodes[], returns how many.
 */
extern int	amr_path_nodes_to_enlarge(const AmrStore *s, const AmrPath *path,
									  const AmrFBox *b, uint32_t *nodes);

/*
 * Inner nodes that took over part of another's entries in one split
 * propagation: a node split (from -> its new sibling) or a new root (old
 * root -> new root).  Lets the caller move per-node state, such as
 * predicate locks, along with the entries.
 */
typedef struct AmrNodeSplits
{
	int			n;
	uint32_t	from[AMR_MAX_HEIGHT + 1];
	uint32_t	to[AMR_MAX_HEIGHT + 1];
} AmrNodeSplits;

/*
 * After a leaf split: set the level-1 entry of the old leaf to left_box and
 * add (right_box, right_leaf) next to it, splitting inner nodes upward as
 * needed.  spare_nodes must hold at least amr_path_nodes_needed() nodes;
 * used ones are set to AMR_INVALID_NODE.  Node splits are recorded in log
 * (if not NULL).  Caller holds the tree exclusively.
 */
extern void amr_apply_leaf_split(AmrStore *s, AmrTree *t, bool nulls,
								 const AmrPath *path,
								 const AmrFBox *left_box,
								 uint32_t right_leaf, const AmrFBox *right_box,
								 uint32_t *spare_nodes, AmrNodeSplits *log);

/* Add the first leaf of an empty tree.  Caller holds the tree exclusively. */
extern void amr_add_first_leaf(AmrStore *s, AmrTree *t, bool nulls,
							   uint32_t leaf_id, const AmrFBox *box);

/* Called with each inner node a search is about to read (predicate locks). */
typedef void (*AmrVisitFn) (uint32_t node_id, void *arg);

/*
 * Collect, in tree order, the leaves whose level-1 boxes pass every key's
 * inner test (all leaves when nkeys is 0).  If visit is not NULL, it is
 * called with every inner node before its entries are read.  Caller holds
 * the tree lock.
 */
extern void amr_collect_leaves(const AmrStore *s, const AmrTree *t, bool nulls,
							   const AmrScanKey *keys, int nkeys,
							   AmrLeafList *out, AmrVisitFn visit, void *visit_arg,
							   AmrReallocFn realloc_fn, void *realloc_arg);

/* Number of leaves (box side) a scan with these keys would visit. */
extern uint64_t amr_count_leaves(const AmrStore *s, const AmrTree *t,
								 const AmrScanKey *keys, int nkeys);

/* Append a leaf id to a list, growing it with realloc_fn. */
extern void amr_leaf_list_push(AmrLeafList *out, uint32_t id,
							   AmrReallocFn realloc_fn, void *arg);

/* ---- Packing (amr_pack.c) ---- */

/* Sort-Tile-Recursive order; groups of at most per_group items. */
extern void amr_str_order(AmrPackItem *items, size_t n, size_t per_group,
						  AmrPackItem *scratch);

/*
 * How many items each slice of STR takes for n items in groups of
 * per_group (a whole number of groups; n when n fits one group).
 */
extern size_t amr_str_slice_items(size_t n, size_t per_group);

/*
 * Packing order: items grouped into size classes (extent a factor of four
 * apart), each class in STR order.  bounds (AMR_SIZE_CLASSES + 1 entries)
 * receives the start of each non-empty class and the end; returns the
 * number of classes.  Groups are cut within classes.
 */
#define AMR_SIZE_CLASSES 8
extern size_t amr_pack_order(AmrPackItem *items, size_t n, size_t per_group,
							 AmrPackItem *scratch, size_t *bounds);

/* The larger side of a box, which size classes compare. */
extern double amr_pack_extent(const AmrFBox *b);

/* The limit of size class 0 from a sample of extents (reordered). */
extern double amr_pack_class_base(double *extents, size_t n);

/* The size class of a box, given amr_pack_class_base's limit. */
extern int	amr_pack_size_class(const AmrFBox *b, double base);

/* An order-preserving 32-bit key of a float that is not NaN. */
static inline uint32_t
amr_float_sort_key(float f)
{
	uint32_t	u;

	memcpy(&u, &f, sizeof(u));
	return (u & UINT32_C(0x80000000)) ? ~u : (u | UINT32_C(0x80000000));
}

/* A point item for a box: its centre's order-preserving keys, and ref. */
static inline AmrPackPoint
amr_pack_point(const AmrFBox *b, uint32_t ref)
{
	AmrPackPoint p;

	/* the centre as amr_fbox_center_x/y compute it; no NaN comes out */
	p.xkey = amr_float_sort_key((float) amr_fbox_center_x(b));
	p.ykey = amr_float_sort_key((float) amr_fbox_center_y(b));
	p.ref = ref;
	return p;
}

/*
 * Sort point items by their x (axis 0) or y (axis 1) key, stably (a radix
 * sort); scratch holds n items.
 */
extern void amr_pack_points_sort(AmrPackPoint *items, size_t n, int axis,
								 AmrPackPoint *scratch);

/*
 * Group point items by size class (cls[i] for items[i], each below
 * AMR_SIZE_CLASSES), stably, through scratch (room for n items); counts[]
 * (AMR_SIZE_CLASSES of them) gets each class's number of items.
 */
extern void amr_pack_points_by_class(AmrPackPoint *items, const uint8_t *cls,
									 size_t n, AmrPackPoint *scratch,
									 size_t *counts);

/*
 * amr_pack_order for point items whose size classes are given (cls[i]
 * for items[i], each below AMR_SIZE_CLASSES); scratch holds n items.
 */
extern size_t amr_pack_points_order(AmrPackPoint *items, const uint8_t *cls,
									size_t n, size_t per_group,
									AmrPackPoint *scratch, size_t *bounds);

/*
 * Build the inner levels over items (leaf boxes and ids) in STR order,
 * filling nodes to at most fill entries.  node_ids must have room for
 * amr_build_levels_nodes_needed(n, fill) ids; every node is reserved before
 * anything is linked, so on failure nothing changes.  Caller holds the tree
 * exclusively and the tree has no nodes for this side yet.  items is
 * reordered and overwritten.
 */
extern size_t amr_build_levels_nodes_needed(size_t n, int fill);
extern AmrStatus amr_build_levels(AmrStore *s, AmrTree *t, bool nulls,
								  AmrPackItem *items, size_t n, int fill,
								  AmrPackItem *scratch, uint32_t *node_ids);

/* R*-tree split of n boxes; goes_right[i] set for the second group. */
extern void amr_rstar_split(const AmrFBox *boxes, int n, int min_fill,
							uint8_t *goes_right);

/* ---- Structure-modifying operations (amr_ops.c) ---- */

#define AMR_INVALID_SLOT		UINT32_MAX

/*
 * Slots of each tier that only operations which free a slot for every slot
 * they take (a split's left half, rewrites, VACUUM) may use, so that a full
 * index can still be vacuumed: an SSD image cannot be changed in place.
 */
#define AMR_SLOT_RESERVE		8

/*
 * Why a slot is taken, which decides whether it may come from the reserve
 * and from the other tier (docs/design.md, "Commit points").
 */
typedef enum AmrSlotPurpose
{
	AMR_SLOT_ADDS,				/* a new leaf, a split's right half: adds a
								 * slot, so stops at the reserve; either tier */
	AMR_SLOT_REPLACES,			/* a split's left half, a rewrite, VACUUM:
								 * frees the slot it replaces, so may use the
								 * reserve; either tier */
	AMR_SLOT_REPLACES_HERE,		/* the same, but on this tier only (a PMEM
								 * rewrite made under the leaf lock, with no
								 * I/O) */
	AMR_SLOT_MIGRATES			/* an optional move to this tier: stops at the
								 * reserve, never the other tier */
} AmrSlotPurpose;

/*
 * Take a free slot for "purpose" on "tier", or where the purpose allows on
 * the other tier; *tier_out says which.  Returns AMR_ERR_PMEM_FULL or
 * AMR_ERR_SSD_FULL (both tiers full: SSD_FULL if there is an SSD tier) and
 * takes nothing when there is none.  The one place of the reserve rule.
 */
extern AmrStatus amr_slot_take(AmrStore *s, AmrSlotPurpose purpose, uint32_t tier,
							   uint32_t *tier_out, uint32_t *slot_out);

/* Give back a slot taken by amr_slot_take that nothing references. */
extern void amr_slot_give_back(AmrStore *s, uint32_t tier, uint32_t slot);

/*
 * What a split (or a tree's first leaf) may consume, reserved before the
 * first persistent change so that running out of anything fails cleanly.
 * Each slot is on a tier chosen by the caller (placement policy).
 */
typedef struct AmrReservation
{
	uint32_t	new_leaf;
	uint32_t	slot_left;
	uint32_t	slot_right;
	uint32_t	tier_left;
	uint32_t	tier_right;
	int			nnodes;
	uint32_t	nodes[AMR_MAX_HEIGHT + 1];
	AmrNodeSplits splits;		/* filled by amr_split_commit */
} AmrReservation;

/* A reservation holding nothing. */
extern void amr_reservation_init(AmrReservation *r);

/*
 * Reserve a leaf id, a slot for the left image on tier_left, one for the
 * right image on tier_right (unless AMR_TIER_NONE) and "need" inner nodes:
 * all or nothing.  A slot on a full tier comes from the other one
 * (r->tier_left/right say where).  The right slot always adds a leaf; the
 * left one does when left_adds is set (a first leaf), and otherwise
 * replaces a slot (see AmrSlotPurpose).
 */
extern AmrStatus amr_reserve(AmrStore *s, int need, uint32_t tier_left,
							 uint32_t tier_right, bool left_adds,
							 AmrReservation *r);

/* Return whatever the operation did not consume. */
extern void amr_release_reservation(AmrStore *s, AmrReservation *r);

/* Inner nodes a split of the leaf at the end of "path" will consume. */
extern int	amr_path_nodes_needed(const AmrStore *s, const AmrPath *path);

extern AmrFBox amr_entry_fbox(const AmrLeafEntry *e);

/* Return the slot a (former) Leaf Table word referenced to its bitmap. */
extern void amr_free_word_slot(AmrStore *s, uint64_t word);

/* Bytes of an image that carry meaning (header and entries). */
extern size_t amr_leaf_image_bytes(const AmrLeaf *img);

/* Copy an image into a PMEM slot and persist it. */
extern void amr_pmem_write_image(AmrStore *s, uint32_t slot, const AmrLeaf *img);

extern void amr_leaf_volatile_reset(AmrLeafVolatile *v);

/*
 * A tree side's first leaf: prepare the image (for r->new_leaf, holding e);
 * the caller makes it durable in r->slot_left; commit publishes it and
 * links it into the empty root.  Tree held exclusively.
 */
extern void amr_first_leaf_prepare(AmrStore *s, AmrTree *t, const AmrLeafEntry *e,
								   bool nulls, const AmrReservation *r, AmrLeaf *img);
extern void amr_first_leaf_commit(AmrStore *s, AmrTree *t, const AmrLeafEntry *e,
								  const AmrLeaf *img,
								  bool nulls, AmrReservation *r, uint64_t stamp_lsn);

/*
 * Split the full leaf (image "full", Leaf Table word "word") reached by
 * "path", adding entry e: prepare builds the left image (keeps the leaf id,
 * goes to r->slot_left) and the right image (r->new_leaf, r->slot_right);
 * the caller makes both durable; commit publishes the right half, switches
 * the left (the commit point), frees the old slot, sets the right links and
 * updates the inner nodes.  Tree and leaf held exclusively; the path's boxes
 * already cover e.
 */
extern void amr_split_prepare(AmrStore *s, AmrTree *t, uint32_t leaf_id,
							  const AmrLeaf *full, uint64_t word,
							  const AmrLeafEntry *e, bool nulls,
							  const AmrReservation *r, AmrLeaf *left, AmrLeaf *right,
							  AmrFBox *left_box, AmrFBox *right_box);
extern void amr_split_commit(AmrStore *s, AmrTree *t, uint32_t leaf_id, uint64_t word,
							 const AmrPath *path, bool nulls, AmrReservation *r,
							 const AmrLeaf *left, const AmrLeaf *right,
							 const AmrFBox *left_box, const AmrFBox *right_box,
							 uint64_t stamp_lsn);

/* Single-threaded insert for tools and tests (no locking, PMEM only). */
extern AmrStatus amr_insert_single(AmrStore *s, AmrTree *t, const AmrLeafEntry *e);

/* ---- Checks (amr_check.c) ---- */

/*
 * Verify the inner structure of a tree against the Leaf Table: every box
 * covers its children, levels are consistent, and every leaf of the tree in
 * the Leaf Table is reachable exactly once.  Returns NULL or a message in
 * buf.  Caller holds the tree exclusively.
 */
extern const char *amr_check_tree(const AmrStore *s, const AmrTree *t,
								  uint8_t *seen_scratch,
								  char *buf, size_t buflen);

#endif							/* AMR_TREE_H */
