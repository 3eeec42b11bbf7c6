// The pre-started worker's plan folder was moved into a slot the candidate may write: it moves the
// folder aside and leaves a link in its place, pointing where the parent would then read and write.
#include <stdio.h>
#include <string.h>
#include <unistd.h>

__attribute__((constructor)) static void hostile_replace_plan_folder(void) {
    char here[4096];
    if (!getcwd(here, sizeof here - 8)) return;  // the plan folder, as staged in the slot
    char aside[4096 + 8];
    snprintf(aside, sizeof aside, "%s.aside", here);
    if (rename(here, aside) == 0) symlink(HOSTILE_OUT, here);
    _exit(0);
}
