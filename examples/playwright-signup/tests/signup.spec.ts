import { test, expect } from "signalbox-client/playwright";

const SUBJECT = "Verify your Signup account";

test("a new user verifies their address from the email", async ({ page, signalbox, mailbox, baseURL }) => {
  // Watch before acting: the window opens now, so no earlier email can match.
  const handle = await signalbox.watch({
    recipient: mailbox.address,
    subjectContains: SUBJECT,
    requireRunMarker: true,
    expiresInSeconds: 60,
  });
  // The app copies this header onto the email: Signalbox ties it to this test's run.
  await page.setExtraHTTPHeaders({ "X-Signalbox-Run": signalbox.runId });

  await page.goto("/signup");
  await page.getByLabel("Email").fill(mailbox.address);
  await page.getByRole("button", { name: "Sign up" }).click();
  await expect(page.getByRole("heading", { name: "Check your inbox" })).toBeVisible();

  await handle.wait(); // rejects with SignalExpired, its diagnosis in the report
  const claim = await handle.claim();
  // The email is untrusted input: follow only a link to our own app.
  const link = claim.links.find((url) => url.startsWith(`${baseURL}/verify?`));
  expect(link, `links in the email: ${claim.links.join(", ")}`).toBeDefined();

  await page.goto(link!);
  await expect(page.getByRole("heading", { name: "Your address is verified" })).toBeVisible();
  const receipt = await claim.consume();
  expect(receipt.run_id).toBe(signalbox.runId);
});
