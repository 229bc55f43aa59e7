/*-------------------------------------------------------------------------
 *
 * amr_leafstore.h
 *		The leaf store: the one way the access method reads, writes,
 *		allocates, moves and frees a leaf (docs/design.md, "The leaf store").
 *
 * Build, insert, scan, VACUUM, reconciliation and the tier manager say what
 * they want done to a leaf; the store resolves leaf ids through the Leaf
 * Table (paper Algorithm 1), picks slots (AmrSlotPurpose owns the reserve
 * rule), reads PMEM images in place, SSD images through the SSD cache or
 * the device, writes new images, switches Leaf Table words (the commit
 * point of every rewrite, split and migration) and then does what must
 * follow every switch: return the old slot, refresh the leaf's DRAM copy
 * (rule R6), keep an SSD copy in the SSD cache, and count the access for
 * the hotness score.  No AM file touches the SSD cache, the slot file or a
 * slot bitmap itself.
 *
 * Locking is the caller's, as documented per function: the leaf lock of a
 * leaf being changed, the tree lock where inner nodes change too, and the
 * publish lock (shared) while a taken slot is not yet referenced.
 *
 *-------------------------------------------------------------------------
 */
#ifndef AMR_LEAFSTORE_H
#define AMR_LEAFSTORE_H

#include "amrtree.h"

/* ---- errors ---- */

/* Raise the ERROR (with detail and hint) for a core status other than AMR_OK. */
extern void amr_report_status(AmrStatus st, Relation index);

/* errhint for a damaged index: REINDEX it, on the primary if this is a standby. */
extern int	amr_errhint_reindex(void);

/* The index for messages, or "(tree N)" when no relation is open. */
extern const char *amr_index_name(Relation index, const AmrTree *t);

/* ---- buffers ---- */

/* A 4 KiB-aligned leaf buffer (O_DIRECT), in the current memory context. */
extern AmrLeaf *amr_alloc_leaf_buffer(void);

/* ---- placement of new images ---- */

/* PMEM leaves the index's budget allows with extra_leaves more leaves. */
extern uint64 amr_tree_budget_leaves(const AmrTree *t, uint64 extra_leaves);

/*
 * The tier new images go to when they add new_pmem leaves to PMEM and
 * new_leaves to the index: PMEM within the budget, beyond it as
 * amrtree.budget_on_insert says (see core amr_new_image_tier).
 */
extern uint32 amr_tree_new_image_tier(const AmrTree *t, int new_pmem, int new_leaves);

/* ---- slots ---- */

/*
 * Take a slot for purpose, on tier or where allowed the other one, raising
 * the "full" ERROR (naming index) when there is none.  Caller holds the
 * publish lock in shared mode until the slot is referenced or given back.
 */
extern void amr_take_slot(Relation index, AmrSlotPurpose purpose, uint32 tier,
						  uint32 *tier_out, uint32 *slot_out);

/* The same, returning false instead of raising when there is none. */
extern bool amr_try_take_slot(AmrSlotPurpose purpose, uint32 tier,
							  uint32 *tier_out, uint32 *slot_out);

/* Give back a slot that no Leaf Table word references. */
extern void amr_give_back_slot(uint32 tier, uint32 slot);

/* A free leaf id, or the "Leaf Table full" ERROR. */
extern uint32 amr_take_leaf_id(Relation index);

/* ---- reading ---- */

/*
 * The PMEM image of a leaf, in place, for changes made under its leaf lock
 * (held by the caller; the leaf is on PMEM).  Checked before anyone reads
 * it: a damaged leaf raises an ERROR.  *word_out receives its word.
 */
extern AmrLeaf *amr_leaf_pmem_image(Relation index, AmrTree *t, uint32 leaf_id,
									uint64 *word_out);

/* Check a leaf image against what its word says; ERROR naming the leaf if not. */
extern void amr_leaf_validate(Relation index, const AmrTree *t, uint32 leaf_id,
							  uint64 word, const AmrLeaf *img, bool from_ssd);

/*
 * Copy the current image of a leaf into buf (4 KiB aligned) from whichever
 * tier (or DRAM copy) holds it.  Returns its Leaf Table word, or 0 when the
 * leaf does not belong to tree t.  nsn and rightlink (if not NULL) receive
 * its split links, read under the same lock as the word.  Callers must not
 * hold the leaf lock.
 */
extern uint64 amr_leaf_read(Relation index, AmrTree *t, uint32 leaf_id, AmrLeaf *buf,
							uint64 *nsn, uint32 *rightlink);

/* Up to this many SSD leaves a scan reads with one submission. */
#define AMR_READAHEAD_MAX 16

/* SSD images a scan read ahead, each valid only while its word is unchanged. */
typedef struct AmrReadAhead
{
	int			n;
	MemoryContext cxt;			/* where the buffers go */
	uint32		ids[AMR_READAHEAD_MAX];
	uint64		words[AMR_READAHEAD_MAX];
	AmrLeaf    *bufs[AMR_READAHEAD_MAX];	/* NULL until first needed */
} AmrReadAhead;

/*
 * Set up a scan's read-ahead; its buffers (68 kB) are allocated in the
 * current memory context when it first reads ahead, not before.
 */
extern void amr_readahead_init(AmrReadAhead *ra);

/*
 * Before a scan reads next[0] (next[] being the leaves it will read, in
 * order): if that leaf has to come from the device and was not read ahead,
 * read the device-resident ones among the first AMR_READAHEAD_MAX with one
 * submission, so that the scan waits for the device once, not once per
 * leaf.  No lock held.
 */
extern void amr_readahead(AmrReadAhead *ra, Relation index, const uint32 *next, int nnext);

/* Forget what was read ahead (rescans). */
extern void amr_readahead_reset(AmrReadAhead *ra);

/*
 * amr_leaf_read, taking an SSD image from "ra" when it was read ahead
 * there under the leaf's current word (and leaving it out of the SSD cache).
 */
extern uint64 amr_leaf_read_ahead(Relation index, AmrTree *t, uint32 leaf_id,
								  AmrLeaf *buf, uint64 *nsn, uint32 *rightlink,
								  AmrReadAhead *ra);

/*
 * A scan's copy of a leaf image held in DRAM or on PMEM, made under the
 * leaf lock in shared mode: the header and at least every entry the scan
 * could return (the rest may be left out, and nentries says how many were
 * copied).  It runs with an LWLock held, so it must not raise an error,
 * allocate, or call an operator.
 */
typedef void (*AmrLeafCopyFn) (const AmrLeaf *src, AmrLeaf *dst, void *arg);

/*
 * A scan's read of one leaf of tree t (generation "generation", the one it
 * began with): under the leaf lock, the word and split links (if the leaf
 * split after start_nsn, *follow receives its right link, else
 * AMR_INVALID_LEAF); then the image, from the DRAM copy or PMEM (copied
 * into buf under the lock, by copy_fn if it is not NULL), or from the
 * read-ahead, the SSD cache or the device (whole); and a read access is
 * counted.  Returns the image to evaluate (buf or a read-ahead buffer), or
 * NULL when the leaf is not the tree's.
 */
extern const AmrLeaf *amr_leaf_read_for_scan(Relation index, AmrTree *t, uint32 generation,
											 uint32 leaf_id, uint64 start_nsn,
											 AmrReadAhead *ra, AmrLeaf *buf,
											 AmrLeafCopyFn copy_fn, void *copy_arg,
											 uint32 *follow);

/* ---- writing ---- */

/*
 * Make an image durable in a slot taken for it: a PMEM copy and persist, or
 * an SSD write and sync.  (Several SSD images at once: amr_leaf_write_ssd_batch.)
 */
extern void amr_leaf_write_image(Relation index, uint32 tier, uint32 slot, AmrLeaf *img);

/* Write n images to SSD slots with one submission and one sync. */
extern void amr_leaf_write_ssd_batch(Relation index, const uint32 *slots, AmrLeaf **imgs, int n);

/* How a switch to a new image is logged (amr_wal.h). */
typedef enum AmrSwitchLog
{
	AMR_LOG_REWRITE,			/* new contents: always logged, whole */
	AMR_LOG_MOVE,				/* the same contents elsewhere: logged, whole,
								 * only if the leaf needs a full image since
								 * the last checkpoint (torn copies) */
	AMR_LOG_NONE				/* not logged: WAL replay itself, and
								 * recovery's own repairs (which log what they
								 * leave, see amr_reconcile.c) */
} AmrSwitchLog;

/*
 * Switch a leaf to a new durable image in (tier, slot) with box mbr -- the
 * commit point -- logged as "how" says (for index, or NULL in processes
 * without one), and then do what follows every switch: return the old
 * slot, refresh the DRAM copy (R6), keep an SSD image in the SSD cache, and
 * count a write access if "write".  Caller holds the leaf lock exclusively
 * (and the publish lock shared, since the slot was taken unreferenced).
 * Returns the old word.
 */
extern uint64 amr_leaf_switch(Relation index, AmrTree *t, uint32 leaf_id, uint32 tier,
							  uint32 slot, const AmrFBox *mbr, const AmrLeaf *img,
							  bool write, AmrSwitchLog how);

/*
 * Append an entry to a PMEM leaf in place (into dead position dead_pos if
 * not -1), failure-atomically, logged (its insert_lsn becomes the record's
 * end), refresh its DRAM copy and count the write.  Caller holds the leaf
 * lock exclusively; the leaf has room.
 */
extern void amr_leaf_append(Relation index, AmrTree *t, uint32 leaf_id, AmrLeaf *leaf,
							const AmrLeafEntry *e, const AmrFBox *box, int dead_pos);

/*
 * Mark entries pos[0..n) of a PMEM leaf dead in place, logged, and refresh
 * its DRAM copy.  Caller holds the leaf lock exclusively.
 */
extern void amr_leaf_mark_dead_many(Relation index, AmrTree *t, uint32 leaf_id,
									AmrLeaf *leaf, const uint16 *pos, int n);

/*
 * Mark entry pos of a PMEM leaf dead in place (one persisted 2-byte store),
 * not logged: for recovery's own pruning, which logs the leaf afterwards.
 * Caller holds the leaf lock exclusively and refreshes the DRAM copy.
 */
extern void amr_leaf_mark_dead(AmrLeaf *leaf, int pos);

/* After changes in place: refresh the leaf's DRAM copy (R6), if it has one. */
extern void amr_leaf_refresh_copy(uint32 leaf_id, const AmrLeaf *image);

/*
 * Publish a new leaf of tree t (a build's): its Leaf Table entry with box
 * mbr, then its word (the commit point).  The image is durable in (tier,
 * slot).  Not logged: a build logs its leaves in batches (amr_build.c).
 * Caller holds the publish lock shared.
 */
extern void amr_leaf_publish(AmrTree *t, uint32 leaf_id, uint32 tier, uint32 slot,
							 const AmrLeaf *img, const AmrFBox *mbr, bool nulls);

/*
 * A tree side's first leaf: log it, publish r->new_leaf with image img
 * (durable in r->slot_left) and link it into the empty root.  Caller holds
 * the tree exclusively, in a critical section.
 */
extern void amr_leaf_first_commit(Relation index, AmrTree *t, const AmrLeafEntry *e,
								  const AmrLeaf *img, bool nulls, AmrReservation *r);

/*
 * Split commit: log the split, publish the right half, switch the left
 * (the commit point), update inner nodes (core amr_split_commit); then the
 * switch's duties for both halves.  Caller holds the tree and leaf
 * exclusively, in a critical section until it returns.
 */
extern void amr_leaf_split_commit(Relation index, AmrTree *t, uint32 leaf_id, uint64 word,
								  const AmrPath *path, bool nulls, AmrReservation *r,
								  const AmrLeaf *left, const AmrLeaf *right,
								  const AmrFBox *left_box, const AmrFBox *right_box);

/*
 * Free a leaf of tree t: release its Leaf Table entry (its version still
 * grows), its slot, its id and its DRAM copy.  Caller holds the tree
 * exclusively; no ERROR (runs in commit callbacks).
 */
extern void amr_leaf_free(AmrTree *t, uint32 leaf_id);

/*
 * Live entries of the image "word" names for leaf_id (leaf lock held): read
 * from a PMEM image, else the Leaf Table's count, which is exact for SSD
 * images (immutable) and a hint for a PMEM slot this server cannot own yet
 * (AMR_LEAF_VOLATILE_SUSPECT).  A PMEM slot holding no leaf counts 0.
 */
extern uint64 amr_leaf_current_entries(uint32 leaf_id, uint64 word);

/* ---- DRAM copies held by rule R6 ---- */

/* Hold a DRAM copy of a leaf whose current image is "image" (leaf held exclusively). */
extern bool amr_leaf_hold(AmrTree *t, uint32 leaf_id, const AmrLeaf *image);

/* Let the DRAM copy go (leaf held exclusively). */
extern void amr_leaf_unhold(AmrTree *t, uint32 leaf_id);

/* ---- hotness ---- */

/* Count an access for the hotness score (one relaxed atomic increment). */
extern void amr_leaf_count_access(uint32 leaf_id, bool write);

#endif							/* AMR_LEAFSTORE_H */
