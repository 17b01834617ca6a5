// Load generator of bench/read_path_bench.sh (built there with gcc):
//   read_path_load stress SECONDS THREADS FILE...   mixed mmap / pread readers over FILEs
//   read_path_load reopen SECONDS FILE              open, pread its first 256 bytes, close, in a loop
// Every read reaches the daemon: preads use O_DIRECT, and the mmap readers drop the pages they touched
// (posix_fadvise DONTNEED) so the next touch faults through FUSE again. Each byte read is compared with
// the file as read once at the start. Prints "reads N wrong W seconds S" (W > 0: exit 1).
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

// kReopenRead: the start of a safetensors header (what a loader reads first), served from the view's own
// bytes: the loop measures the open, not the source reads behind a range of a 1,024-rank tensor.
enum { kRead = 64 << 10, kReopenRead = 256, kMaxFiles = 16 };

struct File {
  const char* path;
  size_t size;
  unsigned char* bytes;  // the whole file, read once
};

static struct File files[kMaxFiles];
static int nfiles;
static double deadline;
static atomic_ulong reads, wrong;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char* what, const char* path) {
  perror(path);
  fprintf(stderr, "read_path_load: %s failed\n", what);
  exit(2);
}

static void load(struct File* f) {
  int fd = open(f->path, O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) die("open", f->path);
  f->size = (size_t)st.st_size;
  f->bytes = malloc(f->size);
  for (size_t done = 0; done < f->size;) {
    ssize_t n = pread(fd, f->bytes + done, f->size - done, (off_t)done);
    if (n <= 0) die("read", f->path);
    done += (size_t)n;
  }
  close(fd);
}

static uint64_t next(uint64_t* state) {  // xorshift64
  *state ^= *state << 13;
  *state ^= *state >> 7;
  *state ^= *state << 17;
  return *state;
}

static void* pread_reader(void* arg) {
  uint64_t state = (uintptr_t)arg * 2654435761u + 1;
  void* buf;
  if (posix_memalign(&buf, 4096, kRead) != 0) exit(2);
  int fds[kMaxFiles];
  for (int i = 0; i < nfiles; ++i)
    if ((fds[i] = open(files[i].path, O_RDONLY | O_DIRECT)) < 0) die("open O_DIRECT", files[i].path);
  while (now() < deadline) {
    const struct File* f = &files[next(&state) % nfiles];
    const int fd = fds[f - files];
    const size_t pages = f->size > kRead ? (f->size - kRead) / 4096 : 0;
    const size_t at = pages ? (next(&state) % pages) * 4096 : 0;
    const size_t want = f->size - at < kRead ? f->size - at : kRead;
    ssize_t n = pread(fd, buf, want, (off_t)at);
    if (n != (ssize_t)want || memcmp(buf, f->bytes + at, want) != 0) atomic_fetch_add(&wrong, 1);
    atomic_fetch_add(&reads, 1);
  }
  for (int i = 0; i < nfiles; ++i) close(fds[i]);
  free(buf);
  return NULL;
}

static void* mmap_reader(void* arg) {
  uint64_t state = (uintptr_t)arg * 40503u + 7;
  int fds[kMaxFiles];
  unsigned char* maps[kMaxFiles];
  for (int i = 0; i < nfiles; ++i) {
    if ((fds[i] = open(files[i].path, O_RDONLY)) < 0) die("open", files[i].path);
    maps[i] = mmap(NULL, files[i].size, PROT_READ, MAP_SHARED, fds[i], 0);
    if (maps[i] == MAP_FAILED) die("mmap", files[i].path);
  }
  unsigned char* copy = malloc(kRead);
  while (now() < deadline) {
    const int i = (int)(next(&state) % nfiles);
    const struct File* f = &files[i];
    const size_t pages = f->size > kRead ? (f->size - kRead) / 4096 : 0;
    const size_t at = pages ? (next(&state) % pages) * 4096 : 0;
    const size_t want = f->size - at < kRead ? f->size - at : kRead;
    memcpy(copy, maps[i] + at, want);
    if (memcmp(copy, f->bytes + at, want) != 0) atomic_fetch_add(&wrong, 1);
    posix_fadvise(fds[i], (off_t)at, (off_t)want, POSIX_FADV_DONTNEED);  // the next touch faults again
    atomic_fetch_add(&reads, 1);
  }
  for (int i = 0; i < nfiles; ++i) {
    munmap(maps[i], files[i].size);
    close(fds[i]);
  }
  free(copy);
  return NULL;
}

static void reopen_loop(void) {
  const struct File* f = &files[0];
  void* buf;
  if (posix_memalign(&buf, 4096, kReopenRead) != 0) exit(2);
  const size_t want = f->size < kReopenRead ? f->size : kReopenRead;
  while (now() < deadline) {
    const int fd = open(f->path, O_RDONLY | O_DIRECT);
    if (fd < 0) die("open O_DIRECT", f->path);
    if (pread(fd, buf, want, 0) != (ssize_t)want || memcmp(buf, f->bytes, want) != 0)
      atomic_fetch_add(&wrong, 1);
    close(fd);
    atomic_fetch_add(&reads, 1);
  }
  free(buf);
}

int main(int argc, char** argv) {
  const int stress = argc >= 5 && strcmp(argv[1], "stress") == 0;
  if (!stress && !(argc == 4 && strcmp(argv[1], "reopen") == 0)) {
    fprintf(stderr, "usage: %s stress SECONDS THREADS FILE... | reopen SECONDS FILE\n", argv[0]);
    return 2;
  }
  const double seconds = atof(argv[2]);
  const int threads = stress ? atoi(argv[3]) : 1;
  for (int i = stress ? 4 : 3; i < argc && nfiles < kMaxFiles; ++i) {
    files[nfiles].path = argv[i];
    load(&files[nfiles++]);
  }
  const double start = now();
  deadline = start + seconds;
  if (stress) {
    pthread_t t[64];
    const int n = threads < 64 ? threads : 64;
    for (int i = 0; i < n; ++i)  // even: pread, odd: mmap
      pthread_create(&t[i], NULL, i % 2 ? mmap_reader : pread_reader, (void*)(uintptr_t)(i + 1));
    for (int i = 0; i < n; ++i) pthread_join(t[i], NULL);
  } else {
    reopen_loop();
  }
  printf("reads %lu wrong %lu seconds %.3f\n", atomic_load(&reads), atomic_load(&wrong), now() - start);
  return atomic_load(&wrong) == 0 ? 0 : 1;
}
