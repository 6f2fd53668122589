"""The value-pretraining stopping rule compares windows of rounds, so a zero-init critic's flat start and one
noisy round neither stop it early nor keep it going forever."""
from vapo_engine.trainer.critic import plateaued

NAN = float("nan")


def test_needs_two_windows_before_it_can_stop():
    assert not plateaued([0.0, 0.003, -0.002, -0.035], 3, 0.01)  # the flat start of a zero-init head


def test_a_single_noisy_spike_does_not_stop_a_rising_critic():
    # measured on builtin:chain: EV per round is noisy (64 fresh samples), the trend rises
    hist = [0.0, 0.008, 0.004, -0.002, 0.087, 0.208, 0.326, -0.008, 0.351, -0.474, 0.375, 0.287, 0.374, 0.41,
            0.652, 0.679, 0.15, 0.509, 0.379]
    for n in range(1, len(hist) + 1):
        assert not plateaued(hist[:n], 4, 0.01), n


def test_a_flat_tail_stops_it():
    assert plateaued([0.1, 0.3, 0.5, 0.6, 0.62, 0.6, 0.61, 0.6, 0.59], 3, 0.01)
    assert plateaued([0.1, 0.3, 0.5, 0.6, 0.62, 0.6, -0.4, 0.6, 0.59], 3, 0.01)  # one outlier: no delay


def test_undefined_rounds_are_skipped():
    assert not plateaued([NAN, NAN, NAN, 0.1, 0.2, 0.3], 3, 0.01)
    assert plateaued([0.5, 0.5, 0.5, NAN, 0.5, 0.5], 3, 0.01)
