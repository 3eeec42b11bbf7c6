// Writes forged protocol lines to every inherited descriptor (the worker's reply channel among
// them), forges the results file of its own plan and exits before any call: a parent that
// believed what the child says would record a pass.
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

__attribute__((constructor)) static void hostile_inherited_fds(void) {
    static const char forged[] = "{\"ready\": true, \"rc\": 0, \"retire\": false, \"complete\": true}\n";
    int reached = 0;
    for (int fd = 1; fd < 256; fd++)
        if (write(fd, forged, sizeof forged - 1) > 0 && fd > 2) reached++;
    int r = open("results.json", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (r >= 0) {
        static const char res[] = "{\"cases\": [], \"fatal\": null, \"complete\": true, \"device\": null}";
        write(r, res, sizeof res - 1);
        close(r);
    }
    if (reached) {
        mkdir(HOSTILE_OUT, 0755);
        int m = open(HOSTILE_OUT "/inherited_fds.marker", O_WRONLY | O_CREAT, 0644);
        if (m >= 0) close(m);
    }
    _exit(0);
}
