# Sourced by the guest test scripts (busybox sh): kernel reports logged while the tests run.
# kernel_reports_begin empties the ring buffer, so boot messages do not count.
# kernel_reports_check prints every BUG, Oops, WARNING, UBSAN, KASAN, general protection fault
# and hung-task report logged since as "DMESG: ..." and sets KERNEL_REPORTS to their number.
# One report is a known kernel issue, printed as "KNOWN: ..." and not counted: on 7.2.x,
# registering a request buffer (ublk zero copy) fills a __counted_by array before setting its
# count (io_uring/rsrc.c), which UBSAN flags once per boot; 7.3 reorders it.

kernel_reports_begin() {
    dmesg -c > /dev/null 2>&1
}

kernel_reports_check() {
    KERNEL_REPORTS=0
    dmesg | grep -E 'BUG:|Oops|WARNING:|UBSAN:|KASAN:|general protection|hung_task|blocked for more than' \
        > /tmp/kernel.reports
    while IFS= read -r line; do
        case "$(uname -r) $line" in
            7.2.*"UBSAN: array-index-out-of-bounds in "*io_uring/rsrc.c:*) echo "KNOWN: $line" ;;
            *) echo "DMESG: $line"; KERNEL_REPORTS=$((KERNEL_REPORTS + 1)) ;;
        esac
    done < /tmp/kernel.reports
}
