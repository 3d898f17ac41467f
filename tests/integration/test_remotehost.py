"""The second libvirtd (remotehost.py) that the many-hosts tests stand on: it starts, answers
on its own TCP address, is independent of the host's libvirtd, and leaves nothing behind."""
import os
import subprocess
import unittest

from remotehost import RemoteHost


class RemoteHostTest(unittest.TestCase):
    def test_independent_daemon(self):
        h = RemoteHost().start()
        try:
            d = h.dir
            r = h.virsh("uri")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.decode().strip(), h.uri)
            self.assertEqual(h.domains(), [])
            # Its own daemon: a domain defined there is not in the host's libvirtd.
            xml = os.path.join(d, "probe.xml")
            with open(xml, "w") as f:
                f.write("<domain type='qemu'><name>airlock-remotehost-probe</name>"
                        "<memory unit='MiB'>32</memory><os><type>hvm</type></os></domain>")
            r = h.virsh("define", xml)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(h.domains(), ["airlock-remotehost-probe"])
            local = subprocess.run(["virsh", "-q", "-c", "qemu:///system", "list", "--all",
                                    "--name"], stdout=subprocess.PIPE, timeout=60)
            self.assertNotIn(b"airlock-remotehost-probe", local.stdout)
        finally:
            h.stop()
        self.assertFalse(os.path.exists(d))
        r = subprocess.run(["virsh", "-c", h.uri, "version"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=30)
        self.assertNotEqual(r.returncode, 0)


if __name__ == "__main__":
    unittest.main()
