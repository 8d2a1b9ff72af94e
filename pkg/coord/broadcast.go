package coord

// broadcast wakes every waiter at once: waiters take the channel of C (under
// their owner's lock) and wait for it to close; notify closes it and makes
// a new one. The zero value is ready to use. Not safe by itself: its owner's
// lock guards it.
type broadcast struct{ ch chan struct{} }

// C is the channel that the next notify closes.
func (b *broadcast) C() <-chan struct{} {
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

// notify wakes those waiting on C.
func (b *broadcast) notify() {
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}
