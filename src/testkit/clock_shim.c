/*
 * quorumlock testkit clock shim: LD_PRELOAD into redis-server to make its
 * wall clock (CLOCK_REALTIME, gettimeofday, time) run at another rate or
 * jump, as a node with a bad clock would. The monotonic clock is left alone.
 *
 * Controlled through a 32-byte file named by QUORUMLOCK_CLOCK_FILE, mapped
 * shared so changes are seen without a system call:
 *   u64 seq_a | f64 rate | i64 step_ns | u64 seq_b
 * The writer stores seq_a, then the settings, then seq_b (separate writes,
 * in that order), all with one new number; a reader loads seq_b, the
 * settings, then seq_a, and a read that finds them unequal (a write in
 * progress) keeps the last settings.
 * A new rate applies from the moment it is seen (the clock stays
 * continuous); a change of step_ns moves the clock by the difference.
 *
 * Real time is read with the raw system call, never through dlsym or libc
 * wrappers, so an allocator that reads the clock while starting up
 * (jemalloc) cannot recurse into us. The lock is taken around fork()
 * (redis forks for AOF rewrites), so a child never inherits it held.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

struct control {
    volatile uint64_t seq_a;
    volatile double rate;
    volatile int64_t step_ns;
    volatile uint64_t seq_b;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static const struct control *control;
static int started;
static uint64_t seen = UINT64_MAX;
static int64_t anchor_real, anchor_fake, step_now;
static double rate_now = 1.0;

static void lock_before_fork(void) { pthread_mutex_lock(&lock); }
static void unlock_after_fork(void) { pthread_mutex_unlock(&lock); }

__attribute__((constructor)) static void install_fork_handlers(void) {
    pthread_atfork(lock_before_fork, unlock_after_fork, unlock_after_fork);
}

static int64_t real_ns(clockid_t id) {
    struct timespec ts;
    syscall(SYS_clock_gettime, id, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void attach(void) {
    const char *path = getenv("QUORUMLOCK_CLOCK_FILE");
    if (path == NULL) return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    void *map = mmap(NULL, sizeof(struct control), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map != MAP_FAILED) control = map;
}

static int64_t fake_ns(void) {
    int64_t real = real_ns(CLOCK_REALTIME);
    pthread_mutex_lock(&lock);
    if (!started) {
        started = 1;
        anchor_real = real;
        anchor_fake = real;
        attach();
    }
    if (control != NULL) {
        uint64_t b = __atomic_load_n(&control->seq_b, __ATOMIC_ACQUIRE);
        double rate = control->rate;
        int64_t step = control->step_ns;
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        uint64_t a = __atomic_load_n(&control->seq_a, __ATOMIC_ACQUIRE);
        if (a == b && a != seen && rate >= 0.0 && rate <= 1000.0) {
            int64_t now = anchor_fake + (int64_t)((double)(real - anchor_real) * rate_now);
            anchor_real = real;
            anchor_fake = now + (step - step_now);
            rate_now = rate;
            step_now = step;
            seen = a;
        }
    }
    int64_t out = anchor_fake + (int64_t)((double)(real - anchor_real) * rate_now);
    pthread_mutex_unlock(&lock);
    return out;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    if (id != CLOCK_REALTIME && id != CLOCK_REALTIME_COARSE) {
        return (int)syscall(SYS_clock_gettime, id, ts);
    }
    int64_t ns = fake_ns();
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
    return 0;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    /* Declared nonnull, but be kind to callers that pass NULL anyway. */
    struct timeval *volatile out = tv;
    if (out == NULL) return 0;
    int64_t ns = fake_ns();
    out->tv_sec = ns / 1000000000LL;
    out->tv_usec = (ns % 1000000000LL) / 1000;
    return 0;
}

time_t time(time_t *out) {
    time_t now = (time_t)(fake_ns() / 1000000000LL);
    if (out != NULL) *out = now;
    return now;
}
