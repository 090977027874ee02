"""Transport: communicators per traffic class and waits that leave the CPU to the compute."""
