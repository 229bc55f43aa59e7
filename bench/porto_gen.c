/*-------------------------------------------------------------------------
 *
 * porto_gen.c
 *		Deterministic generator of "Porto-like" taxi-trajectory MBRs.
 *
 * The AMR-Tree paper (like FBR-Tree) benchmarks on the Porto taxi MBR data
 * set: one box per pair of consecutive GPS fixes 15 s apart, written as
 * "xmin ymin tmin xmax ymax tmax" (longitude, latitude, time/1e4 s).  Only a
 * 1,000-line sample of it is available (bench/data/), so this program
 * synthesises data with the same statistics at any size.  The constants
 * below were calibrated against that sample with bench/calibrate.py.
 *
 * Model (porto mode):
 *	- The output is one long stream of GPS fixes; every consecutive pair of
 *	  fixes becomes one box.  Trips follow each other in the stream, so the
 *	  box joining the last fix of one trip to the first fix of the next is
 *	  the "trip-joining" box, exactly as in the real data.
 *	- A trip starts near one of ~30 taxi-stand clusters (or, sometimes, at a
 *	  street-hail location anywhere in the city) and is a random walk with a
 *	  persistent heading, small gradual turns plus occasional corner turns,
 *	  an autocorrelated lognormal speed, occasional stops (GPS jitter around
 *	  a fixed point, or crawling in traffic) and rare GPS glitches (a fix a
 *	  few km off the track).
 *	  Positions reflect at the borders of the sample's bounding region.
 *	- Fixes are quantised like the source data (lon 1e-6 deg, lat 1e-5 deg,
 *	  time 1 s), which is what makes stopped taxis produce exactly
 *	  degenerate boxes.
 *	- Time within a trip increases by 15 s per fix.  Trip start times follow
 *	  a clock that advances with the row count plus a per-trip jitter, as in
 *	  the sample, where trips of different taxis overlap in time: the time
 *	  trend is increasing, but a trip-joining box may go back in time.
 *
 * uniform mode keeps every box's width, height and time span (the same box
 * stream is generated) but moves the box to a uniformly random position in
 * the same x/y region and time range, as a contrast without any clustering.
 *
 * Build:  cc -O2 -Wall -Wextra -o bench/porto_gen bench/porto_gen.c -lm
 *
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/*
 * Fixed-point units used for every coordinate we print.  Working in
 * integers makes the output exact (no printf rounding surprises), makes it
 * fast to format, and reproduces the quantisation of the source data.
 */
#define X_SCALE		1000000		/* longitude: 6 decimals, as in the sample */
#define Y_SCALE		100000		/* latitude: 5 decimals */
#define T_SCALE		10000		/* time is seconds / 1e4: 4 decimals = 1 s */

/* Bounding region of the sample (degrees); walks reflect at its borders. */
#define REGION_XMIN	(-8.6891)
#define REGION_XMAX	(-8.5623)
#define REGION_YMIN	41.0972
#define REGION_YMAX	41.1879

/* Metres per degree at Porto's latitude (41.15 N), for metric step sizes. */
#define M_PER_DEG_X	83832.0
#define M_PER_DEG_Y	110574.0

/* City centre (near Aliados / Baixa), around which stands are scattered. */
#define CITY_X		(-8.614)
#define CITY_Y		41.158

#define STEP_SECONDS	15		/* GPS sampling period */
#define T0_SECONDS		636858	/* 63.6858: first fix time of the sample */

/*
 * Trip start clock: seconds per output row, and the spread of the per-trip
 * jitter.  Fitted on the sample (start time vs row number: slope 2.93 s/row,
 * residual sd ~730 s, range about -2100..+1300 s).
 */
#define CLOCK_S_PER_ROW		2.93
#define START_JITTER_SD		730.0
#define START_JITTER_MAX	2200.0

/*
 * Trip length in boxes: lognormal.  The full data set has ~21 trip-joining
 * boxes per 1,000, i.e. ~47 boxes per trip including the joining box.
 */
#define TRIP_LEN_MEDIAN		37.5
#define TRIP_LEN_SIGMA		0.65
#define TRIP_LEN_MIN		2
#define TRIP_LEN_MAX		600

/* Taxi stands: how many, how trip starts scatter around them. */
#define N_STANDS			30
#define STAND_SD_X_M		2200.0	/* stand scatter around the centre */
#define STAND_SD_Y_M		900.0
#define START_SD_M			120.0	/* trip start scatter around a stand */
#define P_HAIL				0.30	/* trips starting away from any stand */
#define HAIL_SD_X_M			3000.0
#define HAIL_SD_Y_M			1200.0

/* Moving steps: lognormal length with AR(1) log-speed (traffic persists). */
#define STEP_LOG_MEDIAN_M	160.0
#define STEP_LOG_SIGMA		0.50
#define SPEED_AR			0.75

/* Heading: small gradual turns, sometimes a corner; weak pull to centre. */
#define TURN_SD_DEG			14.0
#define P_CORNER			0.36
#define CORNER_MIN_DEG		20.0
#define CORNER_MAX_DEG		90.0
#define P_SNAP				0.5 /* a corner turn lands on a main axis, */
#define P_SNAP_EW			0.65	/* east-west, else north-south */
#define SNAP_SD_DEG			10.0
#define HOMING				0.06	/* fraction of bearing error fixed/step */
#define HOMING_RANGE_M		3000.0

/*
 * Stops and crawling (lights, jams, pick-ups): in the sample ~25% of steps
 * are under 45 m, in runs of mostly 1-4 fixes plus a few long waits (9-16
 * fixes).  Only ~2% of steps repeat the fix exactly; most stopped steps
 * move by GPS noise (~2 m), and the rest crawl forward 5-45 m.
 */
#define P_STOP				0.088
#define STOP_CONTINUE		0.62	/* geometric run length, mean ~2.6 */
#define P_LONG_STOP			0.10
#define LONG_STOP_MIN		6
#define LONG_STOP_MAX		18
#define P_STOP_EXACT		0.08	/* identical fix while stopped */
#define P_STOP_JITTER		0.50	/* GPS noise only; else crawl forward */
#define JITTER_MEDIAN_M		2.0
#define JITTER_SIGMA		0.9
#define CRAWL_MEDIAN_M		15.0
#define CRAWL_SIGMA			0.7

/*
 * GPS glitches: a fix 2-5 km off the track for 1-2 fixes, then back.  In the
 * sample ~0.7% of within-trip boxes are longer than 1 km because of them;
 * they matter to an index because they are the largest non-joining boxes.
 */
#define P_GLITCH			0.004	/* per moving step */
#define GLITCH_MEDIAN_M		3200.0
#define GLITCH_SIGMA		0.3

#define OUTBUF_SIZE		(1 << 20)
#define LINE_MAX_BYTES	160

typedef enum
{
	MODE_PORTO,
	MODE_UNIFORM
} GenMode;

typedef enum
{
	FMT_TXT,
	FMT_CSV,
	FMT_SQL_COPY
} OutFormat;

/*
 * xoshiro256** state: small, fast, and the same stream on every platform.
 * (The output is reproducible for a given seed and row count; only a libm
 * whose exp/log/cos differ in the last ulp could, very rarely, move a
 * quantised coordinate by one unit.)
 */
typedef struct
{
	uint64_t	s[4];
} Rng;

/* One GPS fix in output units. */
typedef struct
{
	int64_t		x;				/* longitude * X_SCALE */
	int64_t		y;				/* latitude * Y_SCALE */
	int64_t		t;				/* seconds (time/1e4 * T_SCALE) */
} Fix;

/* One output box in output units. */
typedef struct
{
	int64_t		xmin,
				ymin,
				tmin,
				xmax,
				ymax,
				tmax;
} Box;

typedef struct
{
	double		x,
				y;				/* degrees */
	double		weight;			/* cumulative, for Zipf-like sampling */
} Stand;

/* Random-walk generator state for porto mode. */
typedef struct
{
	Rng			rng;
	Stand		stands[N_STANDS];
	double		x,
				y;				/* true position, degrees */
	double		heading;		/* radians, in metric space */
	double		logspeed;		/* log step length (m) deviation, AR(1) */
	int64_t		t;				/* time of the current fix, seconds */
	int64_t		last_t;			/* time of the previous emitted fix */
	long		steps_left;		/* boxes left in the current trip */
	long		stop_left;		/* fixes left in the current stop */
	int			glitch_left;	/* fixes left in the current glitch */
	double		glitch_dx,
				glitch_dy;		/* glitch offset, degrees */
	uint64_t	rows_done;		/* boxes emitted so far (drives the clock) */
	int			started;
} Walker;

/* ------------------------------------------------------------------------
 * PRNG
 * ------------------------------------------------------------------------
 */

static uint64_t
splitmix64(uint64_t *state)
{
	uint64_t	z = (*state += UINT64_C(0x9E3779B97F4A7C15));

	z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
	return z ^ (z >> 31);
}

/* Seed xoshiro from splitmix64, as its authors recommend. */
static void
rng_seed(Rng *r, uint64_t seed)
{
	uint64_t	sm = seed;
	int			i;

	for (i = 0; i < 4; i++)
		r->s[i] = splitmix64(&sm);
}

static inline uint64_t
rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static inline uint64_t
rng_next(Rng *r)
{
	uint64_t   *s = r->s;
	uint64_t	result = rotl(s[1] * 5, 7) * 9;
	uint64_t	t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return result;
}

/* Uniform double in [0, 1), 53 random bits. */
static inline double
rng_uniform(Rng *r)
{
	return (double) (rng_next(r) >> 11) * 1.1102230246251565e-16;	/* 2^-53 */
}

/* Uniform integer in [0, n), n > 0; bias is ~n / 2^53, irrelevant here. */
static inline uint64_t
rng_below(Rng *r, uint64_t n)
{
	return (uint64_t) (rng_uniform(r) * (double) n);
}

/*
 * Standard normal via Box-Muller.  We discard the second value rather than
 * caching it so the stream consumed per call is fixed, which keeps the
 * output easy to reason about when constants change.
 */
static double
rng_normal(Rng *r)
{
	double		u1 = rng_uniform(r);
	double		u2 = rng_uniform(r);

	if (u1 < 1e-300)
		u1 = 1e-300;
	return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* ------------------------------------------------------------------------
 * Geometry helpers
 * ------------------------------------------------------------------------
 */

/* Wrap an angle to (-pi, pi]. */
static double
wrap_angle(double a)
{
	while (a > M_PI)
		a -= 2.0 * M_PI;
	while (a <= -M_PI)
		a += 2.0 * M_PI;
	return a;
}

/*
 * Reflect v into [lo, hi].  Returns 1 if a reflection happened so the
 * caller can mirror the heading too (a taxi turns back at the edge instead
 * of pressing against it).
 */
static int
reflect(double *v, double lo, double hi)
{
	int			flipped = 0;

	/* Loop: a huge step could cross both borders (not with our limits). */
	while (*v < lo || *v > hi)
	{
		if (*v < lo)
			*v = 2.0 * lo - *v;
		else
			*v = 2.0 * hi - *v;
		flipped = 1;
	}
	return flipped;
}

static inline int64_t
quant(double v, double scale)
{
	return (int64_t) llround(v * scale);
}

/* ------------------------------------------------------------------------
 * Porto-mode random walk
 * ------------------------------------------------------------------------
 */

/*
 * Place the taxi stands.  They use a fixed seed of their own, so every
 * --seed value describes trips in the same "city": changing the seed gives
 * a new sample of traffic, not a new street layout.
 */
static void
init_stands(Stand *stands)
{
	Rng			r;
	double		total = 0.0;
	int			i;

	rng_seed(&r, UINT64_C(0x506F72746F));	/* "Porto" */
	for (i = 0; i < N_STANDS; i++)
	{
		double		x = CITY_X + rng_normal(&r) * STAND_SD_X_M / M_PER_DEG_X;
		double		y = CITY_Y + rng_normal(&r) * STAND_SD_Y_M / M_PER_DEG_Y;

		reflect(&x, REGION_XMIN, REGION_XMAX);
		reflect(&y, REGION_YMIN, REGION_YMAX);
		stands[i].x = x;
		stands[i].y = y;
		/* Zipf-like popularity: a few stands (station, centre) dominate. */
		total += 1.0 / (i + 1.0);
		stands[i].weight = total;
	}
	for (i = 0; i < N_STANDS; i++)
		stands[i].weight /= total;
}

static void
walker_init(Walker *w, uint64_t seed)
{
	memset(w, 0, sizeof(*w));
	rng_seed(&w->rng, seed);
	init_stands(w->stands);
}

static long
draw_trip_length(Rng *r)
{
	double		len = TRIP_LEN_MEDIAN * exp(TRIP_LEN_SIGMA * rng_normal(r));
	long		n = lround(len);

	if (n < TRIP_LEN_MIN)
		n = TRIP_LEN_MIN;
	if (n > TRIP_LEN_MAX)
		n = TRIP_LEN_MAX;
	return n;
}

/* Begin a new trip: choose start place, time, heading and length. */
static void
start_trip(Walker *w)
{
	Rng		   *r = &w->rng;
	double		jitter;
	int64_t		t;

	if (rng_uniform(r) < P_HAIL)
	{
		w->x = CITY_X + rng_normal(r) * HAIL_SD_X_M / M_PER_DEG_X;
		w->y = CITY_Y + rng_normal(r) * HAIL_SD_Y_M / M_PER_DEG_Y;
	}
	else
	{
		double		u = rng_uniform(r);
		int			k = 0;

		while (k < N_STANDS - 1 && w->stands[k].weight < u)
			k++;
		w->x = w->stands[k].x + rng_normal(r) * START_SD_M / M_PER_DEG_X;
		w->y = w->stands[k].y + rng_normal(r) * START_SD_M / M_PER_DEG_Y;
	}
	reflect(&w->x, REGION_XMIN, REGION_XMAX);
	reflect(&w->y, REGION_YMIN, REGION_YMAX);

	/* Start time: clock driven by output position, plus bounded jitter. */
	jitter = START_JITTER_SD * rng_normal(r);
	if (jitter > START_JITTER_MAX)
		jitter = START_JITTER_MAX;
	if (jitter < -START_JITTER_MAX)
		jitter = -START_JITTER_MAX;
	if (!w->started)
		jitter = 0.0;			/* anchor the first fix at the sample's t0 */
	t = T0_SECONDS + (int64_t) llround(CLOCK_S_PER_ROW * (double) w->rows_done
									   + jitter);
	if (t < 0)
		t = 0;

	/*
	 * The joining box must be recognisable by its time span: make sure it is
	 * neither 0 s nor exactly one sampling step (15 s).
	 */
	if (w->started)
	{
		while (llabs(t - w->last_t) == 0 ||
			   llabs(t - w->last_t) == STEP_SECONDS)
			t++;
	}
	w->t = t;

	w->heading = 2.0 * M_PI * rng_uniform(r);
	w->logspeed = 0.0;
	w->stop_left = 0;
	w->glitch_left = 0;
	w->steps_left = draw_trip_length(r);
	w->started = 1;
}

/* Advance the true position by one 15 s step. */
static void
walk_step(Walker *w)
{
	Rng		   *r = &w->rng;
	double		dist,
				dir;

	if (w->stop_left == 0 && rng_uniform(r) < P_STOP)
	{
		if (rng_uniform(r) < P_LONG_STOP)
			w->stop_left = LONG_STOP_MIN +
				(long) rng_below(r, LONG_STOP_MAX - LONG_STOP_MIN + 1);
		else
		{
			w->stop_left = 1;
			while (rng_uniform(r) < STOP_CONTINUE)
				w->stop_left++;
		}
	}

	if (w->stop_left > 0)
	{
		double		u = rng_uniform(r);

		w->stop_left--;
		if (u < P_STOP_EXACT)
			return;				/* receiver repeats the same fix */
		if (u < P_STOP_EXACT + P_STOP_JITTER)
		{
			/* Standing still: the fix wanders by GPS noise only. */
			dist = JITTER_MEDIAN_M * exp(JITTER_SIGMA * rng_normal(r));
			dir = 2.0 * M_PI * rng_uniform(r);
		}
		else
		{
			/* Crawling in traffic, along the current heading. */
			dist = CRAWL_MEDIAN_M * exp(CRAWL_SIGMA * rng_normal(r));
			dir = w->heading;
		}
		w->x += dist * cos(dir) / M_PER_DEG_X;
		w->y += dist * sin(dir) / M_PER_DEG_Y;
		reflect(&w->x, REGION_XMIN, REGION_XMAX);
		reflect(&w->y, REGION_YMIN, REGION_YMAX);
		return;
	}

	/* Heading: mostly small drift, sometimes a corner, weak homing. */
	if (rng_uniform(r) < P_CORNER)
	{
		double		a = CORNER_MIN_DEG +
		(CORNER_MAX_DEG - CORNER_MIN_DEG) * rng_uniform(r);

		w->heading += (rng_uniform(r) < 0.5 ? -a : a) * M_PI / 180.0;

		/*
		 * Step directions in the sample cluster around east-west and, less
		 * so, north-south (the main avenues); after a corner the taxi is
		 * often driving along such an axis.
		 */
		if (rng_uniform(r) < P_SNAP)
		{
			/* Nearest east-west (0, pi) or north-south (+-pi/2) heading. */
			double		axis = (rng_uniform(r) < P_SNAP_EW) ? 0.0 : M_PI / 2.0;

			w->heading = axis + M_PI * floor((w->heading - axis) / M_PI + 0.5) +
				SNAP_SD_DEG * M_PI / 180.0 * rng_normal(r);
		}
	}
	else
		w->heading += TURN_SD_DEG * M_PI / 180.0 * rng_normal(r);

	{
		/*
		 * Taxis drive towards destinations, most of which are central; a
		 * gentle pull keeps the walk concentrated like the real fixes instead
		 * of diffusing evenly into the reflecting box.
		 */
		double		ex = (CITY_X - w->x) * M_PER_DEG_X;
		double		ey = (CITY_Y - w->y) * M_PER_DEG_Y;
		double		d = sqrt(ex * ex + ey * ey);
		double		pull = HOMING * (d < HOMING_RANGE_M ? d / HOMING_RANGE_M : 1.0);

		w->heading += pull * wrap_angle(atan2(ey, ex) - w->heading);
		w->heading = wrap_angle(w->heading);
	}

	/* Speed persists over consecutive steps (traffic conditions). */
	w->logspeed = SPEED_AR * w->logspeed +
		sqrt(1.0 - SPEED_AR * SPEED_AR) * STEP_LOG_SIGMA * rng_normal(r);
	dist = STEP_LOG_MEDIAN_M * exp(w->logspeed);

	w->x += dist * cos(w->heading) / M_PER_DEG_X;
	w->y += dist * sin(w->heading) / M_PER_DEG_Y;
	if (reflect(&w->x, REGION_XMIN, REGION_XMAX))
		w->heading = wrap_angle(M_PI - w->heading);
	if (reflect(&w->y, REGION_YMIN, REGION_YMAX))
		w->heading = -w->heading;

	/* Rare GPS glitch: report a far-off fix while the taxi drives on. */
	if (w->glitch_left == 0 && rng_uniform(r) < P_GLITCH)
	{
		double		gd = GLITCH_MEDIAN_M * exp(GLITCH_SIGMA * rng_normal(r));
		double		ga = 2.0 * M_PI * rng_uniform(r);

		w->glitch_left = 1 + (int) rng_below(r, 2);
		w->glitch_dx = gd * cos(ga) / M_PER_DEG_X;
		w->glitch_dy = gd * sin(ga) / M_PER_DEG_Y;
	}
}

/* The next fix of the stream; trips follow each other seamlessly. */
static Fix
walker_next_fix(Walker *w)
{
	Fix			f;
	double		x,
				y;

	if (!w->started || w->steps_left == 0)
		start_trip(w);
	else
	{
		walk_step(w);
		w->t += STEP_SECONDS;
		w->steps_left--;
	}

	x = w->x;
	y = w->y;
	if (w->glitch_left > 0)
	{
		x += w->glitch_dx;
		y += w->glitch_dy;
		reflect(&x, REGION_XMIN, REGION_XMAX);
		reflect(&y, REGION_YMIN, REGION_YMAX);
		w->glitch_left--;
	}

	f.x = quant(x, X_SCALE);
	f.y = quant(y, Y_SCALE);
	f.t = w->t;
	w->last_t = w->t;
	return f;
}

static Box
box_of(const Fix *a, const Fix *b)
{
	Box			bx;

	bx.xmin = a->x < b->x ? a->x : b->x;
	bx.xmax = a->x < b->x ? b->x : a->x;
	bx.ymin = a->y < b->y ? a->y : b->y;
	bx.ymax = a->y < b->y ? b->y : a->y;
	bx.tmin = a->t < b->t ? a->t : b->t;
	bx.tmax = a->t < b->t ? b->t : a->t;
	return bx;
}

/*
 * uniform mode: keep the box's extents, move it to a uniform position.
 * A separate PRNG stream is used so the underlying box stream (and thus the
 * size distribution) is identical to porto mode with the same seed.
 */
static void
uniformize(Box *b, Rng *r, int64_t t_lo, int64_t t_hi)
{
	int64_t		rx0 = quant(REGION_XMIN, X_SCALE);
	int64_t		rx1 = quant(REGION_XMAX, X_SCALE);
	int64_t		ry0 = quant(REGION_YMIN, Y_SCALE);
	int64_t		ry1 = quant(REGION_YMAX, Y_SCALE);
	int64_t		w = b->xmax - b->xmin;
	int64_t		h = b->ymax - b->ymin;
	int64_t		s = b->tmax - b->tmin;
	int64_t		tspan = t_hi - t_lo - s;

	b->xmin = rx0 + (int64_t) rng_below(r, (uint64_t) (rx1 - rx0 - w + 1));
	b->ymin = ry0 + (int64_t) rng_below(r, (uint64_t) (ry1 - ry0 - h + 1));
	b->tmin = t_lo;
	if (tspan > 0)
		b->tmin += (int64_t) rng_below(r, (uint64_t) tspan + 1);
	b->xmax = b->xmin + w;
	b->ymax = b->ymin + h;
	b->tmax = b->tmin + s;
}

/* ------------------------------------------------------------------------
 * Output
 * ------------------------------------------------------------------------
 */

/*
 * Format v / 10^decimals like the sample (and like %g for these ranges):
 * no trailing zeros, no decimal point for whole numbers.
 */
static char *
put_fixed(char *p, int64_t v, int decimals, int64_t scale)
{
	uint64_t	a;
	uint64_t	ip,
				fp;
	char		tmp[24];
	int			n = 0;

	if (v < 0)
	{
		*p++ = '-';
		a = (uint64_t) (-(v + 1)) + 1;
	}
	else
		a = (uint64_t) v;
	ip = a / (uint64_t) scale;
	fp = a % (uint64_t) scale;

	do
	{
		tmp[n++] = (char) ('0' + ip % 10);
		ip /= 10;
	} while (ip > 0);
	while (n > 0)
		*p++ = tmp[--n];

	if (fp != 0)
	{
		int			digits = decimals;

		while (fp % 10 == 0)
		{
			fp /= 10;
			digits--;
		}
		*p++ = '.';
		for (n = digits - 1; n >= 0; n--)
		{
			p[n] = (char) ('0' + fp % 10);
			fp /= 10;
		}
		p += digits;
	}
	return p;
}

static char *
put_u64(char *p, uint64_t v)
{
	char		tmp[24];
	int			n = 0;

	do
	{
		tmp[n++] = (char) ('0' + v % 10);
		v /= 10;
	} while (v > 0);
	while (n > 0)
		*p++ = tmp[--n];
	return p;
}

#define PUT_X(p, v) put_fixed((p), (v), 6, X_SCALE)
#define PUT_Y(p, v) put_fixed((p), (v), 5, Y_SCALE)
#define PUT_T(p, v) put_fixed((p), (v), 4, T_SCALE)

/* Write one row; returns the new end of the buffer. */
static char *
put_row(char *p, OutFormat fmt, uint64_t id, const Box *b)
{
	if (fmt == FMT_TXT)
	{
		p = PUT_X(p, b->xmin);
		*p++ = ' ';
		p = PUT_Y(p, b->ymin);
		*p++ = ' ';
		p = PUT_T(p, b->tmin);
		*p++ = ' ';
		p = PUT_X(p, b->xmax);
		*p++ = ' ';
		p = PUT_Y(p, b->ymax);
		*p++ = ' ';
		p = PUT_T(p, b->tmax);
	}
	else
	{
		/* PostgreSQL box literal "(high corner),(low corner)". */
		char		sep = (fmt == FMT_CSV) ? ',' : '\t';

		p = put_u64(p, id);
		*p++ = sep;
		if (fmt == FMT_CSV)
			*p++ = '"';
		*p++ = '(';
		p = PUT_X(p, b->xmax);
		*p++ = ',';
		p = PUT_Y(p, b->ymax);
		*p++ = ')';
		*p++ = ',';
		*p++ = '(';
		p = PUT_X(p, b->xmin);
		*p++ = ',';
		p = PUT_Y(p, b->ymin);
		*p++ = ')';
		if (fmt == FMT_CSV)
			*p++ = '"';
		*p++ = sep;
		p = PUT_T(p, b->tmin);
	}
	*p++ = '\n';
	return p;
}

static int
flush_buf(const char *buf, size_t len)
{
	if (len > 0 && fwrite(buf, 1, len, stdout) != len)
	{
		fprintf(stderr, "porto_gen: write error: %s\n", strerror(errno));
		return -1;
	}
	return 0;
}

/* ------------------------------------------------------------------------
 * Command line
 * ------------------------------------------------------------------------
 */

static void
usage(FILE *out)
{
	fprintf(out,
			"usage: porto_gen [--rows N] [--seed S] [--mode porto|uniform]\n"
			"                 [--format txt|csv|sql-copy]\n"
			"  --rows N     number of boxes to write (default 100000)\n"
			"  --seed S     unsigned 64-bit PRNG seed (default 42)\n"
			"  --mode M     porto: clustered taxi trips (default);\n"
			"               uniform: same box sizes, uniform positions\n"
			"  --format F   txt: \"xmin ymin tmin xmax ymax tmax\" (default)\n"
			"               csv: id,\"(xmax,ymax),(xmin,ymin)\",tmin\n"
			"               sql-copy: id<TAB>(xmax,ymax),(xmin,ymin)<TAB>tmin\n");
}

/* Strict unsigned parse: digits only, no sign, no overflow. */
static int
parse_u64(const char *s, uint64_t *out)
{
	char	   *end;
	unsigned long long v;

	if (s == NULL || *s < '0' || *s > '9')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0 || *end != '\0')
		return -1;
	*out = (uint64_t) v;
	return 0;
}

int
main(int argc, char **argv)
{
	uint64_t	rows = 100000;
	uint64_t	seed = 42;
	GenMode		mode = MODE_PORTO;
	OutFormat	fmt = FMT_TXT;
	Walker	   *w;
	Rng			urng;
	char	   *buf;
	char	   *p;
	Fix			prev;
	int64_t		t_hi;
	uint64_t	i;
	int			a;

	for (a = 1; a < argc; a++)
	{
		const char *opt = argv[a];
		const char *val = (a + 1 < argc) ? argv[a + 1] : NULL;

		if (strcmp(opt, "-h") == 0 || strcmp(opt, "--help") == 0)
		{
			usage(stdout);
			return 0;
		}
		if (strcmp(opt, "--rows") != 0 && strcmp(opt, "--seed") != 0 &&
			strcmp(opt, "--mode") != 0 && strcmp(opt, "--format") != 0)
		{
			fprintf(stderr, "porto_gen: unknown argument \"%s\"\n", opt);
			usage(stderr);
			return 2;
		}
		if (val == NULL)
		{
			fprintf(stderr, "porto_gen: option %s requires a value\n", opt);
			usage(stderr);
			return 2;
		}
		if (strcmp(opt, "--rows") == 0)
		{
			/* Cap keeps the time clock and ids far from overflow. */
			if (parse_u64(val, &rows) != 0 || rows > UINT64_C(1000000000000))
			{
				fprintf(stderr, "porto_gen: invalid --rows \"%s\"\n", val);
				usage(stderr);
				return 2;
			}
		}
		else if (strcmp(opt, "--seed") == 0)
		{
			if (parse_u64(val, &seed) != 0)
			{
				fprintf(stderr, "porto_gen: invalid --seed \"%s\"\n", val);
				usage(stderr);
				return 2;
			}
		}
		else if (strcmp(opt, "--mode") == 0)
		{
			if (strcmp(val, "porto") == 0)
				mode = MODE_PORTO;
			else if (strcmp(val, "uniform") == 0)
				mode = MODE_UNIFORM;
			else
			{
				fprintf(stderr, "porto_gen: invalid --mode \"%s\"\n", val);
				usage(stderr);
				return 2;
			}
		}
		else					/* --format */
		{
			if (strcmp(val, "txt") == 0)
				fmt = FMT_TXT;
			else if (strcmp(val, "csv") == 0)
				fmt = FMT_CSV;
			else if (strcmp(val, "sql-copy") == 0)
				fmt = FMT_SQL_COPY;
			else
			{
				fprintf(stderr, "porto_gen: invalid --format \"%s\"\n", val);
				usage(stderr);
				return 2;
			}
		}
		a++;					/* consumed the value */
	}

	w = malloc(sizeof(Walker));
	buf = malloc(OUTBUF_SIZE);
	if (w == NULL || buf == NULL)
	{
		fprintf(stderr, "porto_gen: out of memory\n");
		return 1;
	}
	walker_init(w, seed);
	/* Independent stream for uniform placement (see uniformize()). */
	rng_seed(&urng, seed ^ UINT64_C(0xD1B54A32D192ED03));
	/* uniform mode spans the time range porto mode would cover. */
	t_hi = T0_SECONDS + (int64_t) llround(CLOCK_S_PER_ROW * (double) rows) +
		STEP_SECONDS;

	p = buf;
	prev = walker_next_fix(w);
	for (i = 0; i < rows; i++)
	{
		Fix			cur = walker_next_fix(w);
		Box			b = box_of(&prev, &cur);

		w->rows_done++;
		prev = cur;
		if (mode == MODE_UNIFORM)
			uniformize(&b, &urng, T0_SECONDS, t_hi);
		p = put_row(p, fmt, i + 1, &b);
		if (p - buf > OUTBUF_SIZE - LINE_MAX_BYTES)
		{
			if (flush_buf(buf, (size_t) (p - buf)) != 0)
				return 1;
			p = buf;
		}
	}
	if (flush_buf(buf, (size_t) (p - buf)) != 0)
		return 1;
	if (fflush(stdout) != 0)
	{
		fprintf(stderr, "porto_gen: write error: %s\n", strerror(errno));
		return 1;
	}
	free(buf);
	free(w);
	return 0;
}
