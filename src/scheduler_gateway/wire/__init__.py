"""What crosses a process boundary: messages, bodies, subjects, error codes and ids. Pure: no IO, no clock."""
