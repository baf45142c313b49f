// SPDX-License-Identifier: GPL-2.0
/*
 * The ballooned symbol of the boot-profiling study (seed 003, Table 2): loaded while the guest
 * boots, its init busy-waits `delay_ms` milliseconds in the kernel's own delay loop (mdelay:
 * delay_tsc on x86 with a TSC), with interrupts on, so that a profiler sampling from the
 * hypervisor finds the time in that named kernel function. delay_ms=0 loads it and does
 * nothing (the control).
 */
#include <linux/delay.h>
#include <linux/module.h>

static unsigned int delay_ms;
module_param(delay_ms, uint, 0444);
MODULE_PARM_DESC(delay_ms, "milliseconds to busy-wait at load");

static int __init vp_balloon_init(void)
{
	unsigned int ms;

	/* One millisecond at a time: mdelay of a large value would overflow its loop count. */
	for (ms = 0; ms < delay_ms; ms++)
		mdelay(1);
	pr_info("vp_balloon: waited %u ms\n", delay_ms);
	return 0;
}

static void __exit vp_balloon_exit(void)
{
}

module_init(vp_balloon_init);
module_exit(vp_balloon_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("virtprof boot-profiling study: a boot-time busy wait of a given length");
