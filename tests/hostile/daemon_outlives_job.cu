// A daemon (fork, setsid, a second fork) that outlives the job and acts after the verdict.
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

__attribute__((constructor)) static void hostile_daemon(void) {
    if (fork() != 0) return;
    setsid();
    if (fork() != 0) _exit(0);
    prctl(PR_SET_NAME, "hostiledaemon", 0, 0, 0);
    for (int fd = 0; fd < 256; fd++) close(fd);
    sleep(3);
    mkdir(HOSTILE_OUT, 0755);
    FILE *f = fopen(HOSTILE_OUT "/daemon.marker", "w");
    if (f) { fputs("the daemon outlived its job\n", f); fclose(f); }
    sleep(30);
    _exit(0);
}
