#pragma once
// Ctrl-C and SIGTERM during long work: the handler only sets a flag; loops call throw_if_interrupted() so the
// error unwinds through destructors, which remove temporary outputs. Nothing half-written is left behind.
namespace qs {

// Call from the main thread before starting others: a signal any thread receives also interrupts the main one.
void install_interrupt_handlers();
bool interrupted();
void throw_if_interrupted();

}  // namespace qs
