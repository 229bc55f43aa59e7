/*-------------------------------------------------------------------------
 *
 * amr_fault.c
 *		amrtree.fault_injection: crash the process at a named point, for the
 *		failure-atomicity tests.  Not for production use.
 *
 * The setting is "operation:point" or "operation:point:N" (crash at the
 * N-th time this process reaches the point; default 1).  The process that
 * reaches it writes the file "amrtree_fault_fired" into the data directory
 * and calls abort(), so the postmaster goes through its crash-restart cycle
 * exactly as after a real crash.  The file disarms the point: a fault fires
 * once per arming, even though the setting (from ALTER SYSTEM, say) is
 * still there after the restart; remove the file to arm it again.
 *
 * The points sit on each side of every persist and every Leaf Table switch
 * of the operations below; AMR_FAULT_POINT() marks them in the code.
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "utils/guc.h"

#define FAULT_FIRED_FILE "amrtree_fault_fired"

/* every point in the code; the setting must name one of them */
static const char *const fault_points[] = {
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
	"split:after_publish",
	"split:after_switch",
	"vacuum:before_image",
	"vacuum:after_image_persisted",
	"vacuum:after_switch",
	"vacuum:before_mark_dead",
	"vacuum:after_mark_dead",
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
	"reconcile:after_release",
	NULL
};

char	   *amr_fault_injection = NULL;

/* the armed point of this process, parsed by the assign hook */
typedef struct FaultArm
{
	char		point[64];
	int			nth;
} FaultArm;

static char fault_point[64];
static int	fault_nth = 0;
static int	fault_hits = 0;
static bool fault_disarmed = false;

static void
fault_fire(const char *point)
{
	int			fd;
	struct rlimit no_core = {0, 0};

	if (fault_disarmed || strcmp(point, fault_point) != 0)
		return;
	if (++fault_hits < fault_nth)
		return;

	fd = open(FAULT_FIRED_FILE, O_CREAT | O_EXCL | O_WRONLY, S_IRUSR | S_IWUSR);
	if (fd < 0)
	{
		/* fired before this arming's restart (or cannot record it): stay up */
		fault_disarmed = true;
		return;
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
check_fault_injection(char **newval, void **extra, GucSource source)
{
	const char *spec = *newval;
	const char *last_colon;
	FaultArm   *arm;
	size_t		len;
	int			i;

	if (spec == NULL || spec[0] == '\0')
		return true;

	/* "extra" is released by the GUC machinery with free() */
	arm = malloc(sizeof(FaultArm));
	if (arm == NULL)
		return false;
	arm->nth = 1;
	len = strlen(spec);
	last_colon = strrchr(spec, ':');
	if (last_colon != NULL && last_colon != strchr(spec, ':'))
	{
		char	   *end;
		long		n = strtol(last_colon + 1, &end, 10);

		if (*end != '\0' || n < 1 || n > 1000000000)
		{
			GUC_check_errdetail("The count after the point must be a positive integer.");
			free(arm);
			return false;
		}
		arm->nth = (int) n;
		len = last_colon - spec;
	}
	if (len >= sizeof(arm->point))
		len = sizeof(arm->point) - 1;
	memcpy(arm->point, spec, len);
	arm->point[len] = '\0';

	for (i = 0; fault_points[i] != NULL; i++)
		if (strcmp(fault_points[i], arm->point) == 0)
			break;
	if (fault_points[i] == NULL)
	{
		GUC_check_errdetail("\"%s\" is not an amrtree fault injection point.", arm->point);
		GUC_check_errhint("The points are listed in docs/user-guide.md, \"Testing crash safety\".");
		free(arm);
		return false;
	}
	*extra = arm;
	return true;
}

static void
assign_fault_injection(const char *newval, void *extra)
{
	FaultArm   *arm = (FaultArm *) extra;

	fault_hits = 0;
	fault_disarmed = false;
	if (arm == NULL)
	{
		fault_point[0] = '\0';
		fault_nth = 0;
		amr_fault_hook = NULL;
		return;
	}
	strlcpy(fault_point, arm->point, sizeof(fault_point));
	fault_nth = arm->nth;
	amr_fault_hook = fault_fire;
}

void
amr_fault_define_guc(void)
{
	DefineCustomStringVariable("amrtree.fault_injection",
							   "Crashes the process at a named point (for crash-safety tests only).",
							   "\"operation:point\" or \"operation:point:N\"; empty disables. "
							   "Fires once, then is disarmed until the file amrtree_fault_fired "
							   "in the data directory is removed.",
							   &amr_fault_injection,
							   "",
							   PGC_SUSET,
							   GUC_NOT_IN_SAMPLE,
							   check_fault_injection,
							   assign_fault_injection,
							   NULL);
}
