/*
 * Native (C) reference for neoxlab.omb: the same latency and allreduce loops as the Python
 * benchmarks, so `make omb-compare` can show what Python adds on top of the MPI library.
 * Written for neoxlab (not derived from OSU's sources); follows OSU's conventions:
 *
 *   latency   ping-pong between ranks 0 and 1 (char data, MPI_Send/MPI_Recv, tag 1);
 *             latency = half a round trip, timed on rank 0 (the rank that starts).
 *   allreduce MPI_Allreduce of floats with MPI_SUM; each rank's average time per call,
 *             then the average (min, max) over ranks.
 *
 * Sizes are powers of two from MIN to MAX (latency: 0 first when MIN is 0; allreduce skips
 * sizes below one float, as OSU skips sizes that hold no element). Sizes above 8192 bytes
 * use the "large" counts: latency 10000/100 (iterations/warm-up) below, 1000/10 above;
 * allreduce 1000/100 and 100/10. -i/-x override both.
 * Timing matches neoxlab.omb.timing.measure. Default, as OSU 7.4: a barrier, then a clock
 * around each call (allreduce: followed by a barrier outside the clock; latency: around
 * each round trip on rank 0), summed over the timed calls. -L: one clock around the whole
 * timed loop after a barrier (neoxlab.omb --timing loop).
 *
 * Output: an OSU-layout table (title and "# Size" header lines, size left-aligned in 10
 * columns, values right-aligned in 20), which neoxlab.omb.osu_format.parse_table reads.
 *
 *   mpiexec -n 2 omb_native latency|allreduce [-m [MIN:]MAX] [-i ITERS] [-x WARMUP] [-f]
 *                                             [-p DIGITS] [-t THREAD_LEVEL] [-L]
 *
 * -p: decimals (OSU prints 2). -t single|funneled|serialized|multiple: the thread level
 * asked of MPI_Init_thread (default single, as OSU's MPI_Init); mpi4py asks for multiple
 * unless told otherwise, which costs MPICH time per call, so comparisons set it alike.
 *
 * Exit codes: 0 ok, 2 bad options (message on rank 0's stderr).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LARGE_MESSAGE_BYTES 8192
#define SIZE_WIDTH 10
#define FIELD_WIDTH 20
#define TAG 1

struct options {
    int allreduce; /* 0: latency, 1: allreduce */
    long min_size, max_size;
    long iterations, warmup; /* -1: the defaults for each size */
    int full, digits;
    int thread_level;
    int loop_timed; /* -L: one clock around the loop instead of one per call */
};

static int rank, nranks;

static int fail(const char *what, const char *fix)
{
    if (rank == 0)
        fprintf(stderr, "omb_native: error: %s; %s\n", what, fix);
    return 2;
}

static int is_pow2(long v) { return v > 0 && (v & (v - 1)) == 0; }

static int parse_long(const char *text, long *out)
{
    char *end;
    long v = strtol(text, &end, 10);
    if (end == text || *end != '\0')
        return 0;
    *out = v;
    return 1;
}

static int parse_sizes(const char *text, struct options *o)
{
    const char *colon = strchr(text, ':');
    char lo[32];
    if (!colon)
        return parse_long(text, &o->max_size);
    if ((size_t)(colon - text) >= sizeof lo)
        return 0;
    memcpy(lo, text, (size_t)(colon - text));
    lo[colon - text] = '\0';
    if (!parse_long(lo, &o->min_size))
        return 0;
    return colon[1] == '\0' || parse_long(colon + 1, &o->max_size);
}

static const char *LEVELS[] = {"single", "funneled", "serialized", "multiple"};

/* MPI_THREAD_* for a level name, or -1. */
static int thread_level(const char *name)
{
    const int values[] = {MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED, MPI_THREAD_SERIALIZED,
                          MPI_THREAD_MULTIPLE};
    for (int k = 0; k < 4; k++)
        if (strcmp(name, LEVELS[k]) == 0)
            return values[k];
    return -1;
}

static const char *level_name(int level)
{
    switch (level) {
    case MPI_THREAD_FUNNELED: return LEVELS[1];
    case MPI_THREAD_SERIALIZED: return LEVELS[2];
    case MPI_THREAD_MULTIPLE: return LEVELS[3];
    default: return LEVELS[0];
    }
}

/* The -t level, read before MPI starts (a bad name is reported after, by rank 0 only). */
static int requested_level(int argc, char **argv)
{
    for (int a = 2; a + 1 < argc; a++)
        if (strcmp(argv[a], "-t") == 0 && thread_level(argv[a + 1]) >= 0)
            return thread_level(argv[a + 1]);
    return MPI_THREAD_SINGLE;
}

static int parse_options(int argc, char **argv, struct options *o)
{
    const char *usage = "usage: omb_native latency|allreduce [-m [MIN:]MAX] [-i ITERS] "
                        "[-x WARMUP] [-f] [-p DIGITS] [-t THREAD_LEVEL] [-L]";
    if (argc < 2)
        return fail("no benchmark given", usage);
    if (strcmp(argv[1], "latency") == 0)
        o->allreduce = 0;
    else if (strcmp(argv[1], "allreduce") == 0)
        o->allreduce = 1;
    else
        return fail("unknown benchmark (latency and allreduce exist)", usage);
    o->min_size = o->allreduce ? 4 : 0;
    o->max_size = o->allreduce ? 1L << 20 : 4L << 20;
    o->iterations = o->warmup = -1;
    o->full = 0;
    o->loop_timed = 0;
    o->digits = 2;
    for (int a = 2; a < argc; a++) {
        const char *arg = argv[a], *val = a + 1 < argc ? argv[a + 1] : NULL;
        if (strcmp(arg, "-f") == 0) {
            o->full = 1;
            continue;
        }
        if (strcmp(arg, "-L") == 0) {
            o->loop_timed = 1;
            continue;
        }
        if (!val)
            return fail("an option lacks its value", usage);
        long num = 0;
        if (strcmp(arg, "-m") == 0) {
            if (!parse_sizes(val, o))
                return fail("-m takes [MIN:]MAX in bytes", "use e.g. -m 1:8");
        } else if (strcmp(arg, "-i") == 0 && parse_long(val, &num) && num >= 1) {
            o->iterations = num;
        } else if (strcmp(arg, "-x") == 0 && parse_long(val, &num) && num >= 0) {
            o->warmup = num;
        } else if (strcmp(arg, "-t") == 0) {
            if (thread_level(val) < 0)
                return fail("-t takes single, funneled, serialized or multiple", usage);
        } else if (strcmp(arg, "-p") == 0 && parse_long(val, &num) && num >= 0 && num <= 9) {
            o->digits = (int)num;
        } else {
            return fail("bad option or value (-i >= 1, -x >= 0, -p 0..9)", usage);
        }
        a++;
    }
    long item = o->allreduce ? (long)sizeof(float) : 1;
    if (!(o->min_size == 0 && !o->allreduce) && !is_pow2(o->min_size))
        return fail("the minimum size is not a power of two (latency also takes 0)",
                    "use e.g. -m 1:8");
    if (!is_pow2(o->max_size) || o->min_size > o->max_size)
        return fail("the maximum size is not a power of two at or above the minimum",
                    "use e.g. -m 4:64");
    if (o->allreduce && o->max_size < item)
        return fail("an allreduce message holds at least one float (4 bytes)", "use -m 1:4 or more");
    if (o->allreduce && o->min_size < item)
        o->min_size = item; /* as OSU: sizes that hold no element are skipped */
    if (!o->allreduce && nranks != 2)
        return fail("latency runs on exactly two ranks", "launch with mpiexec -n 2");
    if (o->allreduce && nranks < 2)
        return fail("allreduce needs at least two ranks", "launch with mpiexec -n 2 or more");
    return 0;
}

static void counts_for(const struct options *o, long size, long *iters, long *warm)
{
    int large = size > LARGE_MESSAGE_BYTES;
    if (o->allreduce) {
        *iters = large ? 100 : 1000;
        *warm = large ? 10 : 100;
    } else {
        *iters = large ? 1000 : 10000;
        *warm = large ? 10 : 100;
    }
    if (o->iterations >= 0)
        *iters = o->iterations;
    if (o->warmup >= 0)
        *warm = o->warmup;
}

/* Seconds for `iters` ping-pongs after `warm` untimed ones; meaningful on rank 0. */
static double pingpong(char *sbuf, char *rbuf, long size, long iters, long warm, int loop)
{
    double t0 = 0.0, total = 0.0;
    int peer = 1 - rank;
    MPI_Barrier(MPI_COMM_WORLD);
    for (long i = 0; i < warm + iters; i++) {
        if (loop && i == warm) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        if (!loop && i >= warm)
            t0 = MPI_Wtime();
        if (rank == 0) {
            MPI_Send(sbuf, (int)size, MPI_CHAR, peer, TAG, MPI_COMM_WORLD);
            MPI_Recv(rbuf, (int)size, MPI_CHAR, peer, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(rbuf, (int)size, MPI_CHAR, peer, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(sbuf, (int)size, MPI_CHAR, peer, TAG, MPI_COMM_WORLD);
        }
        if (!loop && i >= warm)
            total += MPI_Wtime() - t0;
    }
    return loop ? MPI_Wtime() - t0 : total; /* iters >= 1, so t0 was set */
}

static double allreduce(float *sbuf, float *rbuf, long count, long iters, long warm, int loop)
{
    double total = 0.0;
    MPI_Barrier(MPI_COMM_WORLD);
    if (loop) {
        for (long i = 0; i < warm; i++)
            MPI_Allreduce(sbuf, rbuf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (long i = 0; i < iters; i++)
            MPI_Allreduce(sbuf, rbuf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        return MPI_Wtime() - t0;
    }
    for (long i = 0; i < warm + iters; i++) {
        double t0 = MPI_Wtime();
        MPI_Allreduce(sbuf, rbuf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double t1 = MPI_Wtime();
        MPI_Barrier(MPI_COMM_WORLD);
        if (i >= warm)
            total += t1 - t0;
    }
    return total;
}

/* One space for each run of blanks: MPICH pads "Version:" with tabs and spaces. */
static void squeeze(char *text)
{
    char *out = text;
    for (const char *c = text; *c; c++) {
        int blank = *c == ' ' || *c == '\t';
        if (!blank || (out > text && out[-1] != ' '))
            *out++ = blank ? ' ' : *c;
    }
    *out = '\0';
}

static void print_header(const struct options *o)
{
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(lib, &len);
    lib[strcspn(lib, "\n")] = '\0';
    squeeze(lib);
    printf("# neoxlab native (C) MPI %s Test, OSU conventions\n",
           o->allreduce ? "Allreduce Latency" : "Latency");
    printf("# %d ranks, thread level %s, %s\n", nranks, level_name(o->thread_level), lib);
    printf("# Timing: %s\n", o->loop_timed ? "one clock around all timed calls"
                                            : "a clock around each call, as OSU 7.4");
    printf("# Datatype: %s.\n", o->allreduce ? "MPI_FLOAT" : "MPI_CHAR");
    printf("%-*s%*s", SIZE_WIDTH, "# Size", FIELD_WIDTH, "Avg Latency(us)");
    if (o->full)
        printf("%*s%*s%*s", FIELD_WIDTH, "Min Latency(us)", FIELD_WIDTH, "Max Latency(us)",
               FIELD_WIDTH, "Iterations");
    printf("\n");
    fflush(stdout);
}

/* Per-rank microseconds -> avg/min/max over the timed ranks, printed by rank 0. */
static void report(const struct options *o, long size, long iters, double us, int timed)
{
    double lo = timed ? us : 1e300, hi = timed ? us : -1e300;
    double sums[2] = {timed ? us : 0.0, (double)timed}, tot[2], mn, mx;
    MPI_Reduce(&lo, &mn, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
    MPI_Reduce(&hi, &mx, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(sums, tot, 2, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank != 0)
        return;
    printf("%-*ld%*.*f", SIZE_WIDTH, size, FIELD_WIDTH, o->digits, tot[0] / tot[1]);
    if (o->full)
        printf("%*.*f%*.*f%*ld", FIELD_WIDTH, o->digits, mn, FIELD_WIDTH, o->digits, mx,
               FIELD_WIDTH, iters);
    printf("\n");
    fflush(stdout);
}

int main(int argc, char **argv)
{
    struct options o;
    MPI_Init_thread(&argc, &argv, requested_level(argc, argv), &o.thread_level);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    int err = parse_options(argc, argv, &o);
    if (err) {
        MPI_Finalize();
        return err;
    }
    /* page-aligned and written once, as OSU's buffers: calloc'd pages left untouched map
     * to the shared zero page until first written, which times differently */
    void *sbuf = NULL, *rbuf = NULL;
    size_t bytes = (size_t)o.max_size + 1;
    if (posix_memalign(&sbuf, 4096, bytes) || posix_memalign(&rbuf, 4096, bytes)) {
        fprintf(stderr, "omb_native: rank %d cannot allocate %ld bytes\n", rank, o.max_size);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(sbuf, 0, bytes);
    memset(rbuf, 0, bytes);
    if (rank == 0)
        print_header(&o);
    long size = o.min_size;
    while (size <= o.max_size) {
        long iters, warm;
        counts_for(&o, size, &iters, &warm);
        double us;
        if (o.allreduce) {
            double s = allreduce(sbuf, rbuf, size / (long)sizeof(float), iters, warm,
                                 o.loop_timed);
            us = s * 1e6 / (double)iters;
        } else {
            double s = pingpong(sbuf, rbuf, size, iters, warm, o.loop_timed);
            us = s * 1e6 / (2.0 * (double)iters);
        }
        report(&o, size, iters, us, o.allreduce || rank == 0);
        size = size == 0 ? 1 : size * 2;
    }
    free(sbuf);
    free(rbuf);
    MPI_Finalize();
    return 0;
}
