// No libc, no imports: open(2) and write(2) by inline asm, invisible to any symbol check.
static long raw3(long nr, long a, long b, long c) {
    long ret;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return ret;
}

__attribute__((constructor)) static void hostile_raw_syscall(void) {
    static const char path[] = HOSTILE_OUT "/raw_syscall.marker";
    static const char msg[] = "written by a raw syscall\n";
    raw3(83 /* mkdir */, (long)HOSTILE_OUT, 0755, 0);
    long fd = raw3(2 /* open */, (long)path, 0101 /* O_WRONLY|O_CREAT */, 0644);
    if (fd >= 0) {
        raw3(1 /* write */, fd, (long)msg, sizeof msg - 1);
        raw3(3 /* close */, fd, 0, 0);
    }
}
