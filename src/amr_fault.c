/*-------------------------------------------------------------------------
 *
 * amr_fault.c
 *		amrtree.fault_injection: crash the process at a named point, for the
 *		failure-atomicity tests.  Not for production use.
 *
 * The setting is "operation:point" or "operation:point:N" (crash at the
 * N-th time this process reaches the point; default 1), or a comma-separated
 * list of such items, which may include conditions (see below).  The process that
 * reaches it writes the file "amrtree_fault_fired" into the data directory
 * and calls abort(), so the postmaster goes through its crash-restart cycle
 * exactly as after a real crash.  The file disarms the point: a fault fires
 * once per arming, even though the setting (from ALTER SYSTEM, say) is
 * still there after the restart; remove the file to arm it again.
 *
 * The points sit on each side of every persist and every Leaf Table switch
 * of the operations below; AMR_FAULT_POINT() marks them in the code.
 *
 * A few points pause instead of crashing (see fault_pauses below), so that
 * a test can make another session act inside a window that is otherwise
 * microseconds wide.
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/guc.h"
#include "utils/wait_event.h"

#define FAULT_FIRED_FILE "amrtree_fault_fired"
#define FAULT_PAUSED_FILE "amrtree_fault_paused"

/* every point in the code; the setting must name one of them */
static const char *const fault_points[] = {
	"append:after_logged",
	"append:before_entry",
	"append:after_entry_persisted",
	"append:after_count_persisted",
	"append:reuse_after_entry_persisted",
	"append:reuse_after_flag_persisted",
	"first_leaf:before_image",
	"first_leaf:after_image_persisted",
	"first_leaf:after_publish",
	"rewrite:before_image",
	"rewrite:after_image_persisted",
	"rewrite:after_switch",
	"split:before_images",
	"split:after_right_persisted",
	"split:after_new_leaf_persisted",
	"split:after_logged",
	"split:after_publish",
	"split:after_switch",
	"switch:after_logged",
	"switch:count_written",
	"vacuum:before_image",
	"vacuum:after_image_persisted",
	"vacuum:after_switch",
	"vacuum:before_mark_dead",
	"vacuum:before_marks_stored",
	"vacuum:after_mark_dead",
	"vacuum:free_logged",
	"vacuum:leaves_freed",
	"promote:before_copy",
	"promote:after_copy_persisted",
	"promote:after_switch",
	"demote:before_copy",
	"demote:after_copy_persisted",
	"demote:after_switch",
	"build:after_tree_created",
	"build:before_leaf",
	"build:after_leaf_persisted",
	"build:after_leaf_published",
	"build:after_metapage",
	"commit:before_apply",
	"create:before_valid",
	"drop:after_dropped_state",
	"drop:after_leaf_released",
	"drop:before_free_state",
	"reconcile:after_prune_horizon",
	"reconcile:after_prune",
	"reconcile:after_prune_rewrite",
	"reconcile:after_resync_record",
	"reconcile:after_release",
	"redo:before_append",
	"redo:before_switch",
	"redo:before_split",
	NULL
};

char	   *amr_fault_injection = NULL;

/*
 * Conditions, unlike crash points, do not crash: while armed, the code that
 * asks for one (AMR_FAULT_ACTIVE) behaves as if the condition held, so that
 * a test can reach a path that is otherwise rare -- VACUUM of a PMEM leaf
 * when no PMEM slot is free marks entries dead in place; a server that
 * stops after recovery but before anyone reconciled.
 */
static const char *const fault_conditions[] = {
	"vacuum:pmem_full",
	"reconcile:fail",
	"writeback:reboot_lost_extent",
	"upgrade:extent_unknown",
	"redo:split_unlinked",
	"reconcile:resync_in_parts",	/* one image per resync record */
	NULL
};

/*
 * Pauses do not crash either: the process that reaches one (the N-th time,
 * as for a crash point) creates the file amrtree_fault_paused in the data
 * directory and waits until the file is removed -- cancellably where it
 * holds no lock, asleep inside a critical section (move:after_logged,
 * append:before_store, vacuum:after_marks_logged).  A
 * test waits for the file, acts from another session, and removes it.
 */
static const char *const fault_pauses[] = {
	"vacuum:before_removal",	/* VACUUM read a leaf with entries to remove */
	"move:after_logged",		/* a move logged whole, its switch not made */
	"append:before_store",		/* an append logged, its entry not stored */
	"vacuum:after_marks_logged",	/* dead marks logged, not made */
	"writeback:between_vxids",	/* the write-back worker holds no vxid */
	"append:after_decision",	/* an append chose a delta, not yet logged */
	"scan:before_ssd_read",		/* a scan read an SSD leaf's word, unlocked */
	"vacuum:before_free",		/* leaves emptied and logged, not yet freed */
	"redo:after_leaf_replaced", /* replay switched a leaf, its locks let go */
	NULL
};

#define MAX_ARMED 4

/* what the setting arms, parsed by the check hook */
typedef struct FaultArm
{
	int			n;
	struct
	{
		char		point[64];
		int			nth;
		bool		condition;
		bool		pause;
	}			p[MAX_ARMED];
} FaultArm;

static FaultArm armed;
static int	fault_hits[MAX_ARMED];
static bool fault_disarmed = false;

/*
 * Wait at a pause point until the test removes FAULT_PAUSED_FILE.  Outside
 * a critical section it waits on its latch and may be cancelled; inside one
 * (a change between its WAL record and its commit, locks held) it can only
 * sleep, and cannot fail: a file it cannot create is not waited for.
 */
static void
fault_pause(const char *point)
{
	bool		critical = CritSectionCount > 0;
	int			fd;

	/* the log says so before the file exists: tests wait for the file */
	write_stderr("amrtree: fault injection: paused at \"%s\" until %s is removed (pid %d)\n",
				 point, FAULT_PAUSED_FILE, (int) getpid());
	fd = open(FAULT_PAUSED_FILE, O_CREAT | O_TRUNC | O_WRONLY, S_IRUSR | S_IWUSR);
	if (fd < 0)
	{
		if (critical)
		{
			write_stderr("amrtree: fault injection: not pausing at \"%s\": could not create %s\n",
						 point, FAULT_PAUSED_FILE);
			return;
		}
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not create file \"%s\": %m", FAULT_PAUSED_FILE)));
	}
	if (write(fd, point, strlen(point)) < 0)
	{
		/* the file's existence is what matters */
	}
	close(fd);
	while (access(FAULT_PAUSED_FILE, F_OK) == 0)
	{
		if (critical)
		{
			pg_usleep(10000L);
			continue;
		}
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 10L, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

static bool
fault_fire(const char *point)
{
	int			i;
	int			fd;
	struct rlimit no_core = {0, 0};

	for (i = 0; i < armed.n; i++)
		if (strcmp(point, armed.p[i].point) == 0)
			break;
	if (i == armed.n)
		return false;
	if (armed.p[i].condition)
		return true;
	if (armed.p[i].pause)
	{
		if (++fault_hits[i] == armed.p[i].nth)
			fault_pause(point);
		return false;
	}
	if (fault_disarmed || ++fault_hits[i] < armed.p[i].nth)
		return false;

	fd = open(FAULT_FIRED_FILE, O_CREAT | O_EXCL | O_WRONLY, S_IRUSR | S_IWUSR);
	if (fd < 0)
	{
		/* fired before this arming's restart (or cannot record it): stay up */
		fault_disarmed = true;
		return false;
	}
	if (write(fd, amr_fault_injection, strlen(amr_fault_injection)) < 0 ||
		fsync(fd) != 0)
	{
		/* the marker is what keeps us out of a crash loop: best effort */
	}
	close(fd);

	/* a log line that tests can wait for, then a crash without a core file */
	write_stderr("amrtree: fault injection: aborting at \"%s\" (pid %d)\n",
				 point, (int) getpid());
	(void) setrlimit(RLIMIT_CORE, &no_core);
	abort();
}

static bool
known(const char *const *list, const char *name)
{
	int			i;

	for (i = 0; list[i] != NULL; i++)
		if (strcmp(list[i], name) == 0)
			return true;
	return false;
}

/* One "operation:point[:N]" item of the setting. */
static bool
parse_item(const char *item, size_t len, FaultArm *arm)
{
	char		buf[128];
	char	   *first_colon;
	char	   *last_colon;
	int			k = arm->n;

	if (len == 0 || len >= sizeof(buf) || k >= MAX_ARMED)
	{
		GUC_check_errdetail("Give at most %d comma-separated points of at most 63 characters.",
							MAX_ARMED);
		return false;
	}
	memcpy(buf, item, len);
	buf[len] = '\0';
	arm->p[k].nth = 1;
	first_colon = strchr(buf, ':');
	last_colon = strrchr(buf, ':');
	if (first_colon != NULL && last_colon != first_colon)
	{
		char	   *end;
		long		n = strtol(last_colon + 1, &end, 10);

		if (*end != '\0' || n < 1 || n > 1000000000)
		{
			GUC_check_errdetail("The count after \"%s\" must be a positive integer.", buf);
			return false;
		}
		arm->p[k].nth = (int) n;
		*last_colon = '\0';
	}
	if (strlen(buf) >= sizeof(arm->p[k].point))
	{
		GUC_check_errdetail("\"%s\" is not an amrtree fault injection point.", buf);
		return false;
	}
	strlcpy(arm->p[k].point, buf, sizeof(arm->p[k].point));
	arm->p[k].condition = known(fault_conditions, buf);
	arm->p[k].pause = known(fault_pauses, buf);
	if (!arm->p[k].condition && !arm->p[k].pause && !known(fault_points, buf))
	{
		GUC_check_errdetail("\"%s\" is not an amrtree fault injection point.", buf);
		GUC_check_errhint("The points are listed in docs/user-guide.md, \"Testing crash safety\".");
		return false;
	}
	arm->n++;
	return true;
}

static bool
check_fault_injection(char **newval, void **extra, GucSource source)
{
	const char *spec = *newval;
	FaultArm   *arm;

	if (spec == NULL || spec[0] == '\0')
		return true;

	/* "extra" is released by the GUC machinery with free() */
	arm = malloc(sizeof(FaultArm));
	if (arm == NULL)
		return false;
	memset(arm, 0, sizeof(*arm));
	for (;;)
	{
		const char *comma = strchr(spec, ',');
		size_t		len = comma ? (size_t) (comma - spec) : strlen(spec);

		while (len > 0 && *spec == ' ')
			spec++, len--;
		while (len > 0 && spec[len - 1] == ' ')
			len--;
		if (!parse_item(spec, len, arm))
		{
			free(arm);
			return false;
		}
		if (comma == NULL)
			break;
		spec = comma + 1;
	}
	*extra = arm;
	return true;
}

static void
assign_fault_injection(const char *newval, void *extra)
{
	memset(fault_hits, 0, sizeof(fault_hits));
	fault_disarmed = false;
	if (extra == NULL)
	{
		armed.n = 0;
		amr_fault_hook = NULL;
		return;
	}
	armed = *(FaultArm *) extra;
	amr_fault_hook = fault_fire;
}

void
amr_fault_define_guc(void)
{
	DefineCustomStringVariable("amrtree.fault_injection",
							   "Crashes (or pauses) the process at a named point (for tests only).",
							   "\"operation:point\" or \"operation:point:N\" (or a comma-separated list); "
							   "empty disables. "
							   "A crash point fires once, then is disarmed until the file "
							   "amrtree_fault_fired in the data directory is removed; a pause "
							   "point waits while the file amrtree_fault_paused exists.",
							   &amr_fault_injection,
							   "",
							   PGC_SUSET,
							   GUC_NOT_IN_SAMPLE,
							   check_fault_injection,
							   assign_fault_injection,
							   NULL);
}
