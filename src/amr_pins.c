/*-------------------------------------------------------------------------
 *
 * amr_pins.c
 *		Scan pins: what keeps VACUUM from outrunning an index-only scan.
 *
 * An index-only scan trusts the visibility map.  If VACUUM removed an entry
 * and marked the heap page all-visible while a scan still held that entry's
 * TID, the scan would return a deleted row.  So scans that need it
 * (index-only scans and non-MVCC snapshots) pin the leaf whose matches they
 * are returning -- a per-leaf counter in DRAM, tracked per backend with its
 * subtransaction and released when it ends -- and VACUUM, after switching a
 * leaf to an image without the dead entries, waits until the leaf's pins
 * are gone (docs/design.md, "Concurrency").  Plain MVCC scans and bitmap
 * scans need no pin: a reused TID is invisible to them.
 *
 * ("Pin" means only this; the DRAM copies of rule R6 are "holds".)
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#include "utils/wait_event.h"

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
	amr_sync_add(&amr_store.leaves[leaf_id].pins, 1);
	amr_sync_add(&t->pinned, 1);
}

static void
drop_pin(int i)
{
	LocalPin	p = local_pins[i];

	amr_sync_sub(&amr_store.leaves[p.leaf_id].pins, 1);
	amr_sync_sub(&amr_store.trees[p.tree_no].pinned, 1);
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

/* Release the pins of an ending (sub)transaction: all of them at top level. */
static void
release_pins(SubTransactionId subid)
{
	int			i;

	if (amr_shared == NULL)
		return;
	for (i = n_local_pins - 1; i >= 0; i--)
		if (subid == InvalidSubTransactionId || local_pins[i].subid >= subid)
			drop_pin(i);
}

/*
 * Wait until no scan holds a pin on the leaf.  Pins are held only while a
 * scan returns one leaf's matches, so the wait is short.
 */
void
amr_wait_for_unpin(AmrTree *t, uint32 leaf_id)
{
	while (amr_sync_read(&amr_store.leaves[leaf_id].pins) > 0)
	{
		CHECK_FOR_INTERRUPTS();
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 1L, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

static void
pins_xact_callback(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT ||
		event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT ||
		event == XACT_EVENT_PREPARE)
		release_pins(InvalidSubTransactionId);
}

static void
pins_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					  SubTransactionId parentSubid, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB)
		release_pins(mySubid);
}

/* At preload: release every pin when its (sub)transaction ends. */
void
amr_pins_register_callbacks(void)
{
	RegisterXactCallback(pins_xact_callback, NULL);
	RegisterSubXactCallback(pins_subxact_callback, NULL);
}
