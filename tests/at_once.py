"""Several callers released together, as separate processes opening one database would be."""

import threading


def at_once(n: int, work) -> list[Exception]:
    """Run work() in n threads released by one barrier; the exceptions they raised."""
    gate, errors = threading.Barrier(n), []

    def one():
        gate.wait()
        try:
            work()
        except Exception as e:  # noqa: BLE001 - returned to the test
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors
