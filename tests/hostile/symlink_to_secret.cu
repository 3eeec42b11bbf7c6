// Cannot read the signing key from inside the sandbox, so leaves a link to it where the parent
// reads the child's stderr after the job, and exits as a harness error (whose detail quotes the
// last stderr line into the summary, the ledger and the next prompt).
#include <unistd.h>

__attribute__((constructor)) static void hostile_symlink_to_secret(void) {
    unlink("child.stderr");
    symlink(HOSTILE_SECRET, "child.stderr");
    _exit(5);
}
