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
 * resource owner (below) -- and VACUUM waits until the pins of every leaf
 * it visits are gone, whether or not it removed entries there: a split may
 * have moved the entries a scan holds to another leaf (amr_vacuum.c;
 * docs/design.md, "Concurrency").  Plain MVCC scans and bitmap scans need
 * no pin: a reused TID is invisible to them.
 *
 * An ordered scan returns the entries of many leaves in distance order, long
 * after it read them; it pins, when it returns a row, a leaf that holds the
 * row's entry, after checking that no removal pass touched the tree since it
 * read the entry's leaf, or reading the leaf again (see "Removal passes"
 * below, and knn_hold_returned in amr_scan.c).
 *
 * A pin belongs to the resource owner current when it was taken, as a
 * buffer pin does: that of the portal running the scan.  It is released
 * with that owner, not with the subtransaction it was taken in: a cursor
 * declared outside a savepoint and fetched from inside it lives on after
 * ROLLBACK TO, and so must the pin on the leaf whose matches it still
 * holds.
 *
 * On a hot standby, replay removes the entries and the heap records that
 * follow mark the page all-visible, so replay waits for the pins of the
 * leaf it removes entries from, and of the pinned leaves splits took them
 * from (amr_redo_wait_for_unpin, amr_redo_note_split).  It cannot wait
 * forever: past max_standby_streaming_delay (or max_standby_archive_delay)
 * it cancels the transactions holding them, as PostgreSQL resolves a
 * conflict with a buffer pin.  To find them it keeps, per PGPROC, the
 * number of pins and the ids of a few pinned leaves (AmrPinHolder),
 * written by the owner only.
 *
 * ("Pin" means only this; the DRAM copies of rule R6 are "holds".)
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include "access/twophase.h"
#include "access/xact.h"
#include "access/xlogrecovery.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/standby.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

/*
 * Leaves named per holder.  An index-only scan pins one leaf at a time (an
 * ordered one, the leaf of the row it returned last), but a backend may run
 * several scans.  A holder with more pins than named leaves may hold any
 * leaf.
 */
#define AMR_PIN_HOLDER_LEAVES 7

typedef struct AmrPinHolder
{
	pg_atomic_uint32 npins;		/* pins held; raised after a leaf is named,
								 * lowered before its name is cleared */
	pg_atomic_uint32 leaf_plus_one[AMR_PIN_HOLDER_LEAVES];	/* 0: none */
} AmrPinHolder;

static AmrPinHolder *pin_holders = NULL;

typedef struct LocalPin
{
	uint32		tree_no;
	uint32		leaf_id;
	ResourceOwner owner;		/* released with it; NULL: at transaction end */
} LocalPin;

static LocalPin *local_pins = NULL;
static int	n_local_pins = 0;
static int	max_local_pins = 0;

/* Every PGPROC may hold pins: backends, parallel workers. */
static uint32
pin_holder_count(void)
{
	return (uint32) (MaxBackends + NUM_AUXILIARY_PROCS + max_prepared_xacts);
}

Size
amr_pins_shmem_size(void)
{
	return mul_size(pin_holder_count(), sizeof(AmrPinHolder));
}

void
amr_pins_shmem_attach(char *base, bool init)
{
	uint32		i;
	int			j;

	pin_holders = (AmrPinHolder *) base;
	if (!init)
		return;
	for (i = 0; i < pin_holder_count(); i++)
	{
		pg_atomic_init_u32(&pin_holders[i].npins, 0);
		for (j = 0; j < AMR_PIN_HOLDER_LEAVES; j++)
			pg_atomic_init_u32(&pin_holders[i].leaf_plus_one[j], 0);
	}
}

static AmrPinHolder *
my_pin_holder(void)
{
	if (pin_holders == NULL || MyProc == NULL ||
		MyProc->pgprocno < 0 || (uint32) MyProc->pgprocno >= pin_holder_count())
		return NULL;
	return &pin_holders[MyProc->pgprocno];
}

/* Set the first place of h that holds from (if any) to to. */
static void
holder_replace(AmrPinHolder *h, uint32 from, uint32 to)
{
	int			j;

	for (j = 0; j < AMR_PIN_HOLDER_LEAVES; j++)
		if (pg_atomic_read_u32(&h->leaf_plus_one[j]) == from)
		{
			pg_atomic_write_u32(&h->leaf_plus_one[j], to);
			return;
		}
}

/* Name the leaf in this backend's holder (if a place is free), then count it. */
static void
holder_add(uint32 leaf_id)
{
	AmrPinHolder *h = my_pin_holder();

	if (h == NULL)
		return;
	holder_replace(h, 0, leaf_id + 1);
	pg_atomic_fetch_add_u32(&h->npins, 1);
}

/* Uncount the pin, then clear one place naming the leaf. */
static void
holder_remove(uint32 leaf_id)
{
	AmrPinHolder *h = my_pin_holder();

	if (h == NULL)
		return;
	pg_atomic_fetch_sub_u32(&h->npins, 1);
	holder_replace(h, leaf_id + 1, 0);
}

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
	local_pins[n_local_pins].owner = CurrentResourceOwner;
	n_local_pins++;
	holder_add(leaf_id);
	amr_sync_add(&amr_store.leaves[leaf_id].pins, 1);
	amr_sync_add(&t->pinned, 1);
}

static void
drop_pin(int i)
{
	LocalPin	p = local_pins[i];

	amr_sync_sub(&amr_store.leaves[p.leaf_id].pins, 1);
	amr_sync_sub(&amr_store.trees[p.tree_no].pinned, 1);
	holder_remove(p.leaf_id);
	local_pins[i] = local_pins[--n_local_pins];
}

/*
 * Two scans of this backend may pin the same leaf; drop the one taken under
 * the current resource owner if there is one, so that each keeps its own.
 */
void
amr_unpin_leaf(AmrTree *t, uint32 leaf_id)
{
	int			found = -1;
	int			i;

	for (i = n_local_pins - 1; i >= 0; i--)
	{
		if (local_pins[i].tree_no == t->tree_no && local_pins[i].leaf_id == leaf_id)
		{
			found = i;
			if (local_pins[i].owner == CurrentResourceOwner)
				break;
		}
	}
	if (found >= 0)
		drop_pin(found);
}

/* Release the pins of a resource owner being released (NULL: all of them). */
static void
release_pins(ResourceOwner owner)
{
	int			i;

	if (amr_shared == NULL)
		return;
	for (i = n_local_pins - 1; i >= 0; i--)
		if (owner == NULL || local_pins[i].owner == owner)
			drop_pin(i);
}

/*
 * Wait until no scan holds a pin on the leaf.  Pins are held only while a
 * scan returns one leaf's matches (an ordered scan: one row's), so the wait
 * is short unless a cursor stops there.
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

/*
 * The end of the wait replay may make for standby scans: when the WAL now
 * being replayed was received plus the standby delay that applies to it;
 * 0 if it waits without limit (a delay of -1).
 */
static TimestampTz
standby_wait_limit(void)
{
	TimestampTz received;
	bool		from_stream;
	int			delay_ms;

	GetXLogReceiptTime(&received, &from_stream);
	delay_ms = from_stream ? max_standby_streaming_delay : max_standby_archive_delay;
	if (delay_ms < 0)
		return 0;
	return TimestampTzPlusMilliseconds(received, delay_ms);
}

/*
 * Cancel the transactions that may hold a pin on the leaf: those naming it,
 * and those holding more pins than they name (AMR_INVALID_LEAF: all that
 * hold pins).
 */
static void
cancel_pin_holders(uint32 leaf_id)
{
	VirtualTransactionId *victims;
	int			nvictims = 0;
	uint32		i;
	int			j;

	victims = palloc(sizeof(VirtualTransactionId) * pin_holder_count());
	LWLockAcquire(ProcArrayLock, LW_SHARED);
	for (i = 0; i < pin_holder_count(); i++)
	{
		AmrPinHolder *h = &pin_holders[i];
		uint32		npins = pg_atomic_read_u32(&h->npins);
		uint32		named = 0;
		bool		names_it = false;

		if (npins == 0)
			continue;
		for (j = 0; j < AMR_PIN_HOLDER_LEAVES; j++)
		{
			uint32		v = pg_atomic_read_u32(&h->leaf_plus_one[j]);

			named += v != 0;
			names_it |= v == leaf_id + 1;
		}
		if (leaf_id == AMR_INVALID_LEAF || names_it || npins > named)
		{
			GET_VXID_FROM_PGPROC(victims[nvictims], ProcGlobal->allProcs[i]);
			if (VirtualTransactionIdIsValid(victims[nvictims]))
				nvictims++;
		}
	}
	LWLockRelease(ProcArrayLock);
	for (j = 0; j < nvictims; j++)
		(void) CancelVirtualTransaction(victims[j], PROCSIG_RECOVERY_CONFLICT_SNAPSHOT);
	pfree(victims);
}

/* A wait of replay for standby scans: when it began, its limit, whether logged. */
typedef struct RedoPinWait
{
	TimestampTz start;
	TimestampTz limit;
	bool		logged;
} RedoPinWait;

/* Pins on a leaf of t, or on any leaf of t (leaf_id AMR_INVALID_LEAF). */
static uint64
pins_held(AmrTree *t, uint32 leaf_id)
{
	if (leaf_id == AMR_INVALID_LEAF)
		return amr_sync_read(&t->pinned);
	return amr_sync_read(&amr_store.leaves[leaf_id].pins);
}

/*
 * Wait until no scan pins the leaf of t (or, leaf_id AMR_INVALID_LEAF, any
 * leaf of t: then every holder of pins is cancelled past the limit).
 */
static void
redo_wait_for_zero(AmrTree *t, uint32 leaf_id, RedoPinWait *w)
{
	while (pins_held(t, leaf_id) > 0)
	{
		TimestampTz now = GetCurrentTimestamp();
		long		sleep_ms = 1;

		if (w->start == 0)
		{
			w->start = now;
			w->limit = standby_wait_limit();
		}
		if (log_recovery_conflict_waits && !w->logged &&
			TimestampDifferenceExceeds(w->start, now, DeadlockTimeout))
		{
			LogRecoveryConflict(PROCSIG_RECOVERY_CONFLICT_SNAPSHOT, w->start, now, NULL, true);
			w->logged = true;
		}
		if (w->limit != 0 && now >= w->limit)
		{
			cancel_pin_holders(leaf_id);
			sleep_ms = 5;		/* give them time to go, as core does */
		}
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 sleep_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/*
 * Removal passes.  An ordered scan does not pin the leaves whose entries
 * wait in its queue; when it returns one, it pins the leaf then and must know
 * that no removal happened since it read the leaf (amr_scan.c,
 * knn_hold_returned).  A pass's begin is counted before its first removal
 * (sequentially consistent: before it reads any pin), so a scan that pinned
 * a leaf and then sees the count unchanged knows that every pass that could
 * still remove the entry will find its pin.  The end records the pass's
 * number rather than adding one, so that a pass that never ended (its
 * process died) is forgotten at the next one that does; until then, scans
 * only take the slow way (reading the leaf again).
 */
uint64
amr_removal_pass_begin(AmrTree *t)
{
	return amr_sync_add(&t->removals_begun, 1);
}

void
amr_removal_pass_end(AmrTree *t, uint64 pass)
{
	amr_sync_set(&t->removals_finished, pass);
}

/* Origins followed before replay waits for every pin of the tree instead. */
#define AMR_REPLAY_ORIGIN_HOPS 16

void
amr_redo_wait_for_unpin(AmrTree *t, uint32 leaf_id)
{
	RedoPinWait w = {0, 0, false};
	uint32		id = leaf_id;
	int			hops;

	/*
	 * The leaf, and the leaves its entries came from by splits while scans
	 * pinned them: a scan that copied an entry there still returns it (see
	 * amr_redo_note_split).  Past the last hop, every pin of the tree.  Once
	 * waited for, the scans that copied entries before those splits are gone,
	 * and so is the chain.
	 */
	for (hops = 0; id != AMR_INVALID_LEAF; hops++)
	{
		AmrLeafVolatile *v = &amr_store.leaves[id];
		uint32		origin = v->replay_origin;

		redo_wait_for_zero(t, hops < AMR_REPLAY_ORIGIN_HOPS ? id : AMR_INVALID_LEAF, &w);
		v->replay_origin = 0;
		if (hops == AMR_REPLAY_ORIGIN_HOPS)
			break;
		id = origin != 0 ? origin - 1 : AMR_INVALID_LEAF;
	}
	if (w.logged)
		LogRecoveryConflict(PROCSIG_RECOVERY_CONFLICT_SNAPSHOT, w.start, GetCurrentTimestamp(),
							NULL, false);
}

void
amr_redo_note_split(uint32 left_leaf, uint32 right_leaf)
{
	AmrLeafVolatile *left = &amr_store.leaves[left_leaf];

	if (amr_sync_read(&left->pins) > 0 || left->replay_origin != 0)
		amr_store.leaves[right_leaf].replay_origin = left_leaf + 1;
}

/* A transaction's end releases every pin left, owned or not. */
static void
pins_xact_callback(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT ||
		event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT ||
		event == XACT_EVENT_PREPARE)
		release_pins(NULL);
}

/*
 * A resource owner's release (it is CurrentResourceOwner while its callbacks
 * run) releases its pins, with its buffer pins: a portal's when the portal
 * is dropped, a subtransaction's (and its failed portals') when it aborts.
 */
static void
pins_resowner_callback(ResourceReleasePhase phase, bool isCommit,
					   bool isTopLevel, void *arg)
{
	if (phase == RESOURCE_RELEASE_BEFORE_LOCKS && CurrentResourceOwner != NULL)
		release_pins(CurrentResourceOwner);
}

/* At preload: release pins with their resource owner, and at transaction end. */
void
amr_pins_register_callbacks(void)
{
	RegisterXactCallback(pins_xact_callback, NULL);
	RegisterResourceReleaseCallback(pins_resowner_callback, NULL);
}
