"""The top floor: the commands that compose everything below (run, check, plan, resume,
status, calibrate); nothing below imports them."""
